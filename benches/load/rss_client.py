"""Open many concurrent chat streams and hold them open until told to let go.

Used by rss.sh (Python 3.11 standard library only). Each stream is one raw HTTP/1.1
connection POSTing a streaming chat request; it counts as open once its first SSE
event has arrived. When every stream has opened (or failed), prints
`OPEN <opened> <failed>` on stdout, then keeps reading (and discarding) the streams
until the release file exists or --max-hold seconds pass, closes every connection,
and prints `CLOSED`. Exit status 0 only if every stream opened.
"""

import argparse
import asyncio
import json
import os
import sys
import time


async def open_stream(host, port, request, timeout):
    """Connect, send, read the status line, headers and the first event."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(request)
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout)
        if b" 200 " not in status:
            raise RuntimeError(f"status {status.decode(errors='replace').strip()!r}")
        while True:
            line = await asyncio.wait_for(reader.readline(), timeout)
            if line in (b"\r\n", b"\n", b""):
                break
        deadline = time.monotonic() + timeout
        seen = b""
        while b"data:" not in seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no event")
            chunk = await asyncio.wait_for(reader.read(4096), left)
            if not chunk:
                raise RuntimeError("stream closed before its first event")
            seen = (seen + chunk)[-8192:]
        return reader, writer
    except BaseException:
        writer.close()
        raise


async def drain(reader):
    """Read and discard until the connection ends or the task is cancelled."""
    while await reader.read(65536):
        pass


async def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--parallel-opens", type=int, default=50, help="connections being opened at once")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds for each stream to open")
    p.add_argument("--release-file", required=True)
    p.add_argument("--max-hold", type=float, default=120.0)
    a = p.parse_args()

    body = json.dumps(
        {
            "model": a.model,
            "stream": True,
            "messages": [{"role": "user", "content": "Write a very long story."}],
        }
    ).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {a.host}:{a.port}\r\n"
        f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body

    gate = asyncio.Semaphore(a.parallel_opens)
    errors = []

    async def one():
        async with gate:
            try:
                return await open_stream(a.host, a.port, request, a.timeout)
            except (OSError, RuntimeError, asyncio.TimeoutError) as e:
                errors.append(str(e) or type(e).__name__)
                return None

    results = await asyncio.gather(*(one() for _ in range(a.streams)))
    streams = [r for r in results if r is not None]
    drains = [asyncio.create_task(drain(reader)) for reader, _ in streams]
    print(f"OPEN {len(streams)} {len(errors)}", flush=True)
    if errors:
        print(f"first error: {errors[0]}", file=sys.stderr, flush=True)

    deadline = time.monotonic() + a.max_hold
    while not os.path.exists(a.release_file) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)

    for t in drains:
        t.cancel()
    await asyncio.gather(*drains, return_exceptions=True)
    for _, writer in streams:
        writer.close()
    await asyncio.gather(*(w.wait_closed() for _, w in streams), return_exceptions=True)
    print("CLOSED", flush=True)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
