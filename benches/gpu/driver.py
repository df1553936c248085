#!/usr/bin/env python3
"""The GPU-time workload: one person and five agents sharing a two-slot GPU through Switchboard.

- the person: a short streamed question every `--person-every` seconds (a fresh ~40-token
  prompt, max_tokens 16), open loop;
- two compacting agents, closed loop: each request a fresh random `--compact-tokens` prompt
  (max_tokens 64);
- three agents in growing conversations, closed loop: a ~`--start-tokens` first prompt, each
  turn adds the previous answer and ~`--tool-tokens` of tool output; past `--restart-tokens`
  a new conversation starts.

With `--think`, an agent waits that long between its turns (running its tools). With
`--batch-lines`, a Batch API batch of that many short chat lines (client `batcher`) is
uploaded and created as the run starts, and its progress read at the end.

Every request is streamed (`stream_options.include_usage`). At the end of `--duration`
requests still running are cut (their work is not counted). Prints one JSON line: the
person's time to first content token (p50/p95/max), GPU-seconds per agent (the simulator's
`timings.prompt_ms + predicted_ms` of each answer), Jain's index over the agents, the GPU's
busy share (`GET /sim/gpu`), the agents' cache share (`cache_n / (cache_n + prompt_n)`), and
the proxy's preemptions (`switchboard_preemptions_total`).

One word of the prompts is one token of the simulator's tokenizer.

    driver.py --proxy http://127.0.0.1:7700 --sim http://127.0.0.1:7001 --key person=K ...
"""

import argparse
import http.client
import json
import random
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request

WORDS = (
    "the of and to in is that for it as with was on be at by this had not are but from or "
    "have an they which one you were her all she there would their we him been has when who "
    "will more no if out so said what up its about into than them can only other new some "
    "could time these two may then do first any my now such like our over man me even most "
    "made after also did many before must through back years where much your way well down"
).split()


def text(rng, words):
    """`words` words (tokens) of noise, starting with a word of its own (no shared prefix)."""
    head = f"n{rng.getrandbits(48):x}"
    return " ".join([head] + [rng.choice(WORDS) for _ in range(words - 1)])


class Run:
    """What every client thread shares: the deadline, open connections, results."""

    def __init__(self, proxy, model, deadline):
        u = urllib.parse.urlsplit(proxy)
        self.host, self.port = u.hostname, u.port or 80
        self.model = model
        self.deadline = deadline
        self.lock = threading.Lock()
        self.open = set()
        self.stopped = threading.Event()
        self.ttft = []  # the person's
        self.answers = {}  # client -> [(cache_n, prompt_n, gpu_ms)]
        self.cut = {}  # client -> requests cut at the end
        self.errors = []

    def stop(self):
        """Cuts every request still running."""
        self.stopped.set()
        with self.lock:
            conns = list(self.open)
        for c in conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except Exception:  # noqa: BLE001 - already closed
                pass

    def stream(self, client, key, messages, max_tokens):
        """One streamed request. Returns (content, seconds to first content, timings) or
        None when it was cut or failed."""
        body = json.dumps(
            {
                "model": self.model,
                "messages": messages,
                "max_tokens": max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )
        conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
        t0 = time.monotonic()
        first = None
        content, timings = [], None
        try:
            conn.connect()
            with self.lock:
                self.open.add(conn)
            if self.stopped.is_set():
                return None
            conn.request(
                "POST",
                "/v1/chat/completions",
                body=body,
                headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
            )
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"status {resp.status}: {resp.read()[:200]!r}")
            while True:
                line = resp.readline()
                if not line:
                    break
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    raise RuntimeError(f"stream error: {ev['error']}")
                for ch in ev.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content")
                    if piece:
                        if first is None:
                            first = time.monotonic() - t0
                        content.append(piece)
                if "timings" in ev:
                    timings = ev["timings"]
            if timings is None:
                raise RuntimeError("the answer carried no timings")
            return "".join(content), first, timings
        except Exception as e:  # noqa: BLE001 - a cut request, or a failure to report
            if self.stopped.is_set():
                with self.lock:
                    self.cut[client] = self.cut.get(client, 0) + 1
            else:
                with self.lock:
                    self.errors.append(f"{client}: {e}")
            return None
        finally:
            with self.lock:
                self.open.discard(conn)
            conn.close()

    def record(self, client, timings):
        gpu_ms = timings["prompt_ms"] + timings["predicted_ms"]
        with self.lock:
            self.answers.setdefault(client, []).append(
                (timings["cache_n"], timings["prompt_n"], gpu_ms)
            )


def person(run, key, every, seed):
    rng = random.Random(f"person-{seed}")
    threads = []

    def ask(words):
        got = run.stream("person", key, [{"role": "user", "content": words}], 16)
        if got is not None:
            _, first, timings = got
            with run.lock:
                run.ttft.append(first)
            run.record("person", timings)

    at = time.monotonic()
    while not run.stopped.wait(max(0.0, at - time.monotonic())):
        if time.monotonic() >= run.deadline:
            break
        t = threading.Thread(target=ask, args=(text(rng, 38),))
        t.start()
        threads.append(t)
        at += every
    for t in threads:
        t.join()


def compacting(run, name, key, tokens, seed, think):
    rng = random.Random(f"{name}-{seed}")
    while not run.stopped.is_set() and time.monotonic() < run.deadline:
        got = run.stream(name, key, [{"role": "user", "content": text(rng, tokens)}], 64)
        if got is not None:
            run.record(name, got[2])
        run.stopped.wait(think)


def conversation(run, name, key, a, seed):
    rng = random.Random(f"{name}-{seed}")
    messages, size = [], 0
    while not run.stopped.is_set() and time.monotonic() < run.deadline:
        if not messages or size > a.restart_tokens:
            messages = [{"role": "user", "content": text(rng, a.start_tokens)}]
            size = a.start_tokens
        got = run.stream(name, key, messages, 64)
        if got is None:
            continue
        content, _, timings = got
        run.record(name, timings)
        tool = text(rng, a.tool_tokens)
        messages.append({"role": "assistant", "content": content})
        messages.append({"role": "user", "content": "Tool output: " + tool})
        size = timings["cache_n"] + timings["prompt_n"] + 64 + a.tool_tokens
        run.stopped.wait(a.think)


def get(url, key=None):
    req = urllib.request.Request(url, headers={"authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def post(url, key, body, content_type):
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "authorization": f"Bearer {key}", "content-type": content_type})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def start_batch(proxy, key, model, lines, words, seed):
    """Uploads `lines` chat lines of ~`words` tokens each and creates their batch; its id."""
    rng = random.Random(f"batch-{seed}")
    jsonl = "".join(json.dumps({
        "custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": model, "max_tokens": 32,
                 "messages": [{"role": "user", "content": text(rng, words)}]}}) + "\n"
        for i in range(lines)).encode()
    boundary = f"b{rng.getrandbits(64):x}"
    form = (f"--{boundary}\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\ncontent-disposition: form-data; name=\"file\"; "
            f"filename=\"lines.jsonl\"\r\ncontent-type: application/jsonl\r\n\r\n").encode()
    form += jsonl + f"\r\n--{boundary}--\r\n".encode()
    f = post(proxy + "/v1/files", key, form, f"multipart/form-data; boundary={boundary}")
    b = post(proxy + "/v1/batches", key, json.dumps({
        "input_file_id": f["id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h"}).encode(), "application/json")
    return b["id"]


def preemptions(proxy):
    total = 0.0
    for line in get(proxy + "/metrics").splitlines():
        if line.startswith("switchboard_preemptions_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proxy", required=True)
    ap.add_argument("--sim", required=True, help="the simulator's base URL (GET /sim/gpu)")
    ap.add_argument("--mode", default="")
    ap.add_argument("--model", default="m")
    ap.add_argument("--key", action="append", default=[], help="client=KEY, for person, "
                    "compact1, compact2, conv1, conv2, conv3")
    ap.add_argument("--duration", type=float, default=90)
    ap.add_argument("--person-every", type=float, default=2.0)
    ap.add_argument("--compact-tokens", type=int, default=40_000)
    ap.add_argument("--start-tokens", type=int, default=2_000)
    ap.add_argument("--tool-tokens", type=int, default=1_500)
    ap.add_argument("--restart-tokens", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--agents", default="compact1,compact2,conv1,conv2,conv3",
                    help="the agents that run, of compact1, compact2, conv1, conv2, conv3")
    ap.add_argument("--think", type=float, default=0.0,
                    help="seconds an agent waits between its turns")
    ap.add_argument("--batch-lines", type=int, default=0)
    ap.add_argument("--batch-words", type=int, default=200)
    a = ap.parse_args()
    keys = dict(k.split("=", 1) for k in a.key)
    batch = None
    if a.batch_lines:
        batch = start_batch(a.proxy, keys["batcher"], a.model, a.batch_lines, a.batch_words,
                            a.seed)

    busy0 = json.loads(get(a.sim + "/sim/gpu"))["busy_seconds"]
    pre0 = preemptions(a.proxy)
    start = time.monotonic()
    run = Run(a.proxy, a.model, start + a.duration)
    agents = a.agents.split(",")
    threads = [threading.Thread(target=person, args=(run, keys["person"], a.person_every, a.seed))]
    for name in agents:
        if name.startswith("compact"):
            threads.append(threading.Thread(target=compacting, args=(
                run, name, keys[name], a.compact_tokens, a.seed, a.think)))
        else:
            threads.append(threading.Thread(
                target=conversation, args=(run, name, keys[name], a, a.seed)))
    for t in threads:
        t.start()
    time.sleep(max(0.0, run.deadline - time.monotonic()))
    elapsed = time.monotonic() - start
    busy = json.loads(get(a.sim + "/sim/gpu"))["busy_seconds"] - busy0
    run.stop()
    for t in threads:
        t.join()

    gpu_s = {n: sum(x[2] for x in run.answers.get(n, [])) / 1000 for n in agents}
    xs = list(gpu_s.values())
    jain = sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else None
    rows = [x for n in agents for x in run.answers.get(n, [])]
    cache = sum(r[0] for r in rows)
    prompt = sum(r[0] + r[1] for r in rows)
    out = {
        "mode": a.mode,
        "seconds": round(elapsed, 1),
        "person_requests": len(run.ttft),
        "person_ttft_p50_s": pct(run.ttft, 50),
        "person_ttft_p95_s": pct(run.ttft, 95),
        "person_ttft_max_s": max(run.ttft) if run.ttft else None,
        "agent_gpu_s": {n: round(v, 2) for n, v in gpu_s.items()},
        "agent_requests": {n: len(run.answers.get(n, [])) for n in agents},
        "cut_requests": run.cut,
        "jain": round(jain, 3) if jain is not None else None,
        "gpu_busy_share": round(busy / (2 * elapsed), 3),
        "agent_cache_share": round(cache / prompt, 3) if prompt else None,
        "preemptions": preemptions(a.proxy) - pre0,
        "errors": len(run.errors),
    }
    if batch:
        b = json.loads(get(f"{a.proxy}/v1/batches/{batch}", keys["batcher"]))
        out["batch"] = {"status": b["status"], **b["request_counts"]}
    for k in ("person_ttft_p50_s", "person_ttft_p95_s", "person_ttft_max_s"):
        if out[k] is not None:
            out[k] = round(out[k], 3)
    print(json.dumps(out))
    if run.errors:
        print("\n".join(run.errors[:10]), file=sys.stderr)


if __name__ == "__main__":
    main()
