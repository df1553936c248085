"""Time to the first SSE byte, direct to a backend and through Switchboard, interleaved.

usage: python3 benches/load/first_byte.py DIRECT_PORT PROXY_PORT[,PROXY_PORT...] MODEL [N]

All ports are on 127.0.0.1 and must serve the same streaming chat model (e.g. a zero-delay
`switchboard simulate`, and `switchboard serve` and nginx in front of it, as
benches/load/run.sh starts them). Each sample sends one streaming request and measures the
time until the first `data:` bytes arrive; the paths take turns. Two series: on a new
connection per request (the proxy's accept and connection set-up included), and on one
kept-alive connection per path (the relay alone: the request forwarded, the first event
relayed back). Prints the median of each path and its difference to direct. Standard
library only; loopback only; N (default 400) bounded samples per path and series.
"""

import json
import socket
import statistics
import sys
import time


def request(model: str, keep_alive: bool) -> bytes:
    body = json.dumps(
        {
            "model": model,
            "stream": True,
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 200,
        }
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: %d\r\n"
        "Connection: %s\r\n\r\n" % (len(body), "keep-alive" if keep_alive else "close")
    ).encode()
    return head + body


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def first_byte(port: int, model: str) -> float:
    """On a new connection, closed by the server after the stream."""
    with connect(port) as s:
        t0 = time.perf_counter()
        s.sendall(request(model, False))
        seen = b""
        while b"data:" not in seen:
            chunk = s.recv(65536)
            if not chunk:
                break
            seen += chunk
        elapsed = time.perf_counter() - t0
        while s.recv(65536):
            pass
    return elapsed


def first_byte_kept(s: socket.socket, model: str) -> float:
    """On a kept-alive connection: the stream is read to its last chunk, `s` stays open."""
    t0 = time.perf_counter()
    s.sendall(request(model, True))
    seen = b""
    elapsed = None
    while not seen.endswith(b"\r\n0\r\n\r\n"):
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed before the end of the stream")
        seen += chunk
        if elapsed is None and b"data:" in seen:
            elapsed = time.perf_counter() - t0
    if b"transfer-encoding: chunked" not in seen.lower().split(b"\r\n\r\n", 1)[0]:
        raise RuntimeError("a kept-alive stream must be chunked")
    return elapsed


def report(title: str, n: int, direct: int, samples: dict) -> None:
    base = statistics.median(samples[direct]) * 1e6
    print(f"{title}, median of {n} interleaved: direct (:{direct}) {base:.0f} us")
    for port, got in samples.items():
        if port != direct:
            m = statistics.median(got) * 1e6
            print(f"  through :{port} {m:.0f} us, added {m - base:.0f} us")


def main() -> None:
    direct, model = int(sys.argv[1]), sys.argv[3]
    proxies = [int(p) for p in sys.argv[2].split(",")]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 400
    ports = [direct] + proxies
    fresh = {port: [] for port in ports}
    for _ in range(n):
        for port, got in fresh.items():
            got.append(first_byte(port, model))
    report("time to first SSE byte, new connections", n, direct, fresh)
    kept = {port: [] for port in ports}
    conns = {port: connect(port) for port in ports}
    try:
        for _ in range(n):
            for port, got in kept.items():
                got.append(first_byte_kept(conns[port], model))
    finally:
        for s in conns.values():
            s.close()
    report("time to first SSE byte, kept-alive connections", n, direct, kept)


if __name__ == "__main__":
    main()
