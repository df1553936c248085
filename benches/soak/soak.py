#!/usr/bin/env python3
"""Soak of the release binary on loopback (Python 3.11 standard library only).

Starts `switchboard serve` in front of three `switchboard simulate` backends (alias `m` on
replicas r1 and r2, falling back to `spare` on r3) and, for MINUTES minutes, mixes
non-streaming requests, streams read to the end, streams the client drops after a few
events, kills (SIGKILL) and restarts of r1 and r2 in turn, and reloads (the config written
anew and renamed over the old file, picked up by the watcher; every third one by SIGHUP).
With --resend the proxy runs with `server.resend_unanswered`, so requests a killed backend
had taken go on to the other replica. Then it stops the traffic and prints: requests lost (non-streaming answers that are not a
200 with a whole JSON body, streams that ended with neither [DONE] nor an error event),
streams cut by a killed backend (they must end with an error event), in-flight and queued
requests at the end (from /metrics), and the proxy's RSS before and after. Exits 1 when a
request was lost or requests are still in flight. Everything listens on 127.0.0.1; every
process it starts is stopped when it exits.
"""

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

HOST = "127.0.0.1"


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


CONFIG = """
[server]
listen = "{host}:{port}"
workers = 2
health_interval_secs = 1
breaker_failures = 3
breaker_open_ms = 500
stream_idle_timeout_ms = 10000
queue_timeout_secs = 30
resend_unanswered = {resend}

[backends.r1]
url = "http://{host}:{p1}"
flavor = "llamacpp"
slots = 8

[backends.r2]
url = "http://{host}:{p2}"
flavor = "llamacpp"
slots = 8

[backends.r3]
url = "http://{host}:{p3}"
flavor = "llamacpp"
slots = 8

[aliases.m]
backends = ["r1", "r2"]
upstream_model = "sim-model"
fallbacks = ["spare"]
description = "soak round {round}"

[aliases.spare]
backend = "r3"
upstream_model = "sim-model"
"""


class Tally:
    def __init__(self):
        self.n = {k: 0 for k in ("plain_ok", "stream_ok", "cut", "dropped", "lost")}
        self.lost_detail = {}

    def lose(self, why):
        self.n["lost"] += 1
        self.lost_detail[why] = self.lost_detail.get(why, 0) + 1


async def read_head(r):
    line = await r.readline()
    if not line:
        raise ConnectionError("closed before the head")
    status = int(line.split()[1])
    headers = {}
    while True:
        line = await r.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers


async def chunks(r):
    while True:
        size = int((await r.readline()).split(b";")[0], 16)
        if size == 0:
            await r.readline()
            return
        data = await r.readexactly(size)
        await r.readexactly(2)
        yield data


async def one(conn, port, kind, tally):
    """One request on the kept-alive connection `conn` ([reader, writer] or Nones)."""
    if conn[0] is None:
        conn[0], conn[1] = await asyncio.open_connection(HOST, port)
    r, w = conn
    stream = kind != "plain"
    body = json.dumps({
        "model": "m",
        "stream": stream,
        "max_tokens": 12,
        "messages": [{"role": "user", "content": f"soak {random.random()}"}],
    }).encode()
    w.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode() + body
    )
    await w.drain()
    status, headers = await read_head(r)
    chunked = headers.get("transfer-encoding", "") == "chunked"
    if not stream or status != 200:
        if chunked:
            data = b"".join([c async for c in chunks(r)])
        else:
            data = await r.readexactly(int(headers.get("content-length", "0")))
        if status != 200:
            try:
                e = json.loads(data)["error"]
                why = f"{e.get('code')}: {str(e.get('message'))[:60]}"
            except (ValueError, KeyError, TypeError):
                why = "no error envelope"
            tally.lose(f"{'stream' if stream else 'plain'} status {status} ({why})")
            return
        try:
            json.loads(data)
            tally.n["plain_ok"] += 1
        except ValueError:
            tally.lose("plain body not JSON")
        return
    text, events = b"", 0
    async for c in chunks(r):
        text += c
        events = text.count(b"\n\n")
        if kind == "drop" and events >= 2:
            tally.n["dropped"] += 1
            raise ConnectionAbortedError("dropped on purpose")
    if b"data: [DONE]" in text:
        tally.n["stream_ok"] += 1
    elif b'data: {"error"' in text:
        tally.n["cut"] += 1
    else:
        tally.lose("stream without [DONE] or error event")


async def client(port, deadline, tally):
    conn = [None, None]
    while time.monotonic() < deadline:
        kind = random.choices(["plain", "stream", "drop"], [50, 35, 15])[0]
        try:
            await asyncio.wait_for(one(conn, port, kind, tally), 60)
            continue
        except ConnectionAbortedError:
            pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, OSError, ValueError) as e:
            tally.lose(f"{kind}: {type(e).__name__}")
        if conn[1] is not None:
            conn[1].close()
        conn[0] = conn[1] = None


class Fleet:
    def __init__(self, binary, workdir, resend):
        self.binary, self.workdir, self.resend = binary, workdir, resend
        self.ports = {name: free_port() for name in ("proxy", "r1", "r2", "r3")}
        self.procs = {}
        self.path = os.path.join(workdir, "routes.toml")
        self.round = 0
        self.kills = self.reloads = 0

    def config(self):
        p = self.ports
        return CONFIG.format(host=HOST, port=p["proxy"], p1=p["r1"], p2=p["r2"], p3=p["r3"], round=self.round,
                             resend="true" if self.resend else "false")

    def sim(self, name):
        log = open(os.path.join(self.workdir, f"{name}.log"), "ab")
        self.procs[name] = subprocess.Popen(
            [self.binary, "simulate", "--port", str(self.ports[name]), "--slots", "8",
             "--token-delay-ms", "5", "--ttft-ms", "20"],
            stdout=log, stderr=log)

    def start(self):
        with open(self.path, "w") as f:
            f.write(self.config())
        for name in ("r1", "r2", "r3"):
            self.sim(name)
        log = open(os.path.join(self.workdir, "proxy.log"), "ab")
        env = dict(os.environ, RUST_LOG="warn")
        self.procs["proxy"] = subprocess.Popen(
            [self.binary, "serve", "--config", self.path], stdout=log, stderr=log, env=env)

    def reload(self):
        self.round += 1
        self.reloads += 1
        if self.reloads % 3 == 0:
            with open(self.path, "w") as f:
                f.write(self.config())
            self.procs["proxy"].send_signal(signal.SIGHUP)
        else:
            tmp = self.path + ".new"
            with open(tmp, "w") as f:
                f.write(self.config())
            os.rename(tmp, self.path)

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


async def http_get(port, path):
    r, w = await asyncio.open_connection(HOST, port)
    w.write(f"GET {path} HTTP/1.1\r\nhost: soak\r\nconnection: close\r\n\r\n".encode())
    await w.drain()
    data = await r.read()
    w.close()
    return data.decode(errors="replace")


def metric_sum(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def chaos(fleet, deadline):
    victim = 0
    next_kill, next_reload = time.monotonic() + 8, time.monotonic() + 5
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        now = time.monotonic()
        if now >= next_reload:
            fleet.reload()
            next_reload = now + 5
        if now >= next_kill:
            name = ("r1", "r2")[victim % 2]
            victim += 1
            fleet.procs[name].kill()
            fleet.procs[name].wait()
            fleet.kills += 1
            await asyncio.sleep(3)
            fleet.sim(name)
            next_kill = time.monotonic() + 8


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--resend", action="store_true",
                    help="server.resend_unanswered: requests a killed backend took go on")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        fleet = Fleet(os.path.abspath(args.bin), workdir, args.resend)
        fleet.start()
        try:
            return await run(fleet, args)
        finally:
            fleet.stop()


async def run(fleet, args):
    port = fleet.ports["proxy"]
    for _ in range(100):
        try:
            if "ok" in await http_get(port, "/health"):
                break
        except OSError:
            await asyncio.sleep(0.1)
    else:
        print("the proxy did not come up", file=sys.stderr)
        return 1
    warm = Tally()
    await asyncio.gather(*(client(port, time.monotonic() + 5, warm) for _ in range(args.clients)))
    pid = fleet.procs["proxy"].pid
    rss_before = rss_kib(pid)
    tally = Tally()
    deadline = time.monotonic() + args.minutes * 60
    started = time.monotonic()
    await asyncio.gather(chaos(fleet, deadline), *(client(port, deadline, tally) for _ in range(args.clients)))
    inflight = queued = -1
    for _ in range(100):
        m = await http_get(port, "/metrics")
        inflight = metric_sum(m, "switchboard_inflight_requests")
        queued = metric_sum(m, "switchboard_queued_requests")
        if inflight == 0 and queued == 0:
            break
        await asyncio.sleep(0.1)
    rss_after = rss_kib(pid)
    reload_ok = metric_sum(m, 'switchboard_config_reloads_total{result="success"}')
    reload_failed = metric_sum(m, 'switchboard_config_reloads_total{result="failure"}')
    fallbacks = metric_sum(m, "switchboard_fallbacks_total")
    n = tally.n
    total = sum(n.values())
    elapsed = time.monotonic() - started
    print(f"soak: {elapsed / 60:.1f} min, {args.clients} clients, {total} requests ({total / elapsed:.0f}/s)")
    print(f"  non-streaming ok      {n['plain_ok']}")
    print(f"  streams ok            {n['stream_ok']}")
    print(f"  streams dropped by the client on purpose  {n['dropped']}")
    print(f"  streams cut by a killed backend (ended with an error event)  {n['cut']}")
    print(f"  requests lost         {n['lost']}  {tally.lost_detail or ''}")
    print(f"  backend kills/restarts {fleet.kills}, reloads {fleet.reloads} (proxy counted {reload_ok:.0f} ok, {reload_failed:.0f} refused), fallbacks taken {fallbacks:.0f}")
    print(f"  in flight at the end  {inflight:.0f} (queued {queued:.0f})")
    print(f"  proxy RSS before {rss_before} KiB, after {rss_after} KiB")
    return 0 if n["lost"] == 0 and inflight == 0 and queued == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
