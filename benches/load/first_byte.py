"""Time to the first SSE byte, direct to a backend and through Switchboard, interleaved.

usage: python3 benches/load/first_byte.py DIRECT_PORT PROXY_PORT[,PROXY_PORT...] MODEL [N]

All ports are on 127.0.0.1 and must serve the same streaming chat model (e.g. a zero-delay
`switchboard simulate`, and `switchboard serve` and nginx in front of it, as
benches/load/run.sh starts them). Each sample opens a new connection, sends one streaming
request and measures the time until the first `data:` bytes arrive; the paths take turns.
Prints the median of each path and its difference to direct. Standard library only;
loopback only; N (default 400) bounded samples per path.
"""

import json
import socket
import statistics
import sys
import time


def first_byte(port: int, model: str) -> float:
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
        "Connection: close\r\n\r\n" % len(body)
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        s.sendall(head + body)
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


def main() -> None:
    direct, model = int(sys.argv[1]), sys.argv[3]
    proxies = [int(p) for p in sys.argv[2].split(",")]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 400
    samples = {port: [] for port in [direct] + proxies}
    for _ in range(n):
        for port, got in samples.items():
            got.append(first_byte(port, model))
    base = statistics.median(samples[direct]) * 1e6
    print(f"time to first SSE byte, median of {n} interleaved: direct (:{direct}) {base:.0f} us")
    for port in proxies:
        m = statistics.median(samples[port]) * 1e6
        print(f"  through :{port} {m:.0f} us, added {m - base:.0f} us")


if __name__ == "__main__":
    main()
