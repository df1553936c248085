#!/usr/bin/env python3
"""An OTLP/HTTP sink for the load harness: answers every POST /v1/traces with 200 after
reading its body, and counts the exports and their bytes (printed on SIGTERM). Its CPU is
not the proxy's, so the harness can trace to it without charging nginx or Switchboard.
With `hang`, it reads each export and never answers: a collector that is stuck.

usage: otlp_sink.py PORT [hang]"""

import http.server
import signal
import sys
import threading

exports = bytes_in = 0
HANG = sys.argv[2:] == ["hang"]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        global exports, bytes_in
        n = int(self.headers.get("content-length", "0"))
        self.rfile.read(n)
        exports += 1
        bytes_in += n
        if HANG:
            threading.Event().wait()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()


def stop(*_):
    print(f"otlp sink: {exports} exports, {bytes_in} bytes", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
server.daemon_threads = True
server.serve_forever()
