"""The proxy and its backends for the official SDKs' tests.

Backends (SDK_BACKEND):
  sim   (default) simulated backends started here with `switchboard simulate`: llama.cpp for
        the native APIs, and a chat-only server (`flavor = "openai"`) for translation;
  real  the real llama-server at SDK_REAL_URL (started by .ci/sdk), natively and, for
        translation, its chat endpoint alone (`apis = ["chat"]`).

With `sim`, a replay backend (a small HTTP server here, `flavor = "openai"`) also answers
the aliases `replay-<scenario>` with the exact chat answer of a scenario in REPLAY: streams
that interleave text, reasoning and tool calls, answers that are not chat completions,
events that cannot be read. Tests of those aliases are marked `sim_only`.
"""

import http.server
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("SWITCHBOARD_BIN", os.path.join(ROOT, "target", "debug", "switchboard"))
BACKEND = os.environ.get("SDK_BACKEND", "sim")

sim_only = pytest.mark.skipif(BACKEND != "sim", reason="the replay backend runs with SDK_BACKEND=sim")


def _chunk(delta, finish=None, index=0):
    return {"id": "chatcmpl-replay", "object": "chat.completion.chunk", "created": 1,
            "model": "replay", "choices": [{"index": index, "delta": delta,
                                            "finish_reason": finish}]}


def _call(index, args, id=None, name=None):
    f = {"arguments": args}
    if name:
        f["name"] = name
    c = {"index": index, "type": "function", "function": f}
    if id:
        c["id"] = id
    return {"tool_calls": [c]}


def _sse(*chunks, finish="tool_calls"):
    # A chunk as JSON, or raw bytes of an event as they are.
    events = [c if isinstance(c, bytes) else b"data: " + json.dumps(c).encode() + b"\n\n"
              for c in chunks]
    events.append(b"data: " + json.dumps(_chunk({}, finish)).encode() + b"\n\n")
    usage = {"id": "chatcmpl-replay", "object": "chat.completion.chunk", "choices": [],
             "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}}
    events.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


# Scenario -> (the stream's SSE bytes, the whole answer's bytes).
REPLAY = {
    # A call continued after text; a second call (no id) between its fragments; reasoning
    # first; a multibyte char in the arguments; choice 1 in the whole answer ignored.
    "interleaved": (
        _sse(_chunk({"reasoning_content": "Thinking."}),
             _chunk({"content": "Let me look. "}),
             _chunk(_call(0, '{"city":', id="call_w", name="get_weather")),
             _chunk({"content": "One moment."}),
             _chunk(_call(7, '{"tz":"Europe/Par', name="get_time")),
             _chunk(_call(0, '"Paris, \u00cele-de-France"}')),
             _chunk(_call(7, 'is"}')),
             _chunk({"content": "other choice"}, index=1)),
        json.dumps({"id": "chatcmpl-replay", "object": "chat.completion", "created": 1,
                    "model": "replay", "choices": [
                        {"index": 0, "finish_reason": "tool_calls", "message": {
                            "role": "assistant",
                            "content": [{"type": "text", "text": "a"},
                                        {"type": "text", "text": "b"}],
                            "tool_calls": [{"type": "function", "function": {
                                "name": "get_weather", "arguments": {"city": "Paris"}}}]}},
                        {"index": 1, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "other choice"}}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 9,
                              "total_tokens": 14}}).encode(),
    ),
    # No choice to translate.
    "not-a-completion": (
        _sse(),
        json.dumps({"id": "chatcmpl-replay", "object": "chat.completion", "choices": []}).encode(),
    ),
    # A call begun, then an event with a lone surrogate (its rest after it).
    "lone-surrogate": (
        _sse(_chunk(_call(0, '{"city":', id="call_w", name="get_weather")),
             b'data: {"choices":[{"index":0,"delta":{"content":"\\ud800"}}]}\n\n',
             _chunk(_call(0, '"Paris"}'))),
        b"null",
    ),
    # The same with bytes that are not UTF-8.
    "not-utf8": (
        _sse(_chunk(_call(0, '{"city":', id="call_w", name="get_weather")),
             b'data: {"choices":[{"index":0,"delta":{"content":"\xff"}}]}\n\n',
             _chunk(_call(0, '"Paris"}'))),
        b"null",
    ),
}


class _Replay(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status, content_type, body):
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        models = [{"id": name, "object": "model"} for name in REPLAY]
        self._send(200, "application/json", json.dumps({"object": "list", "data": models}).encode())

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        sse, whole = REPLAY.get(body.get("model"), (None, None))
        if sse is None:
            self._send(404, "application/json", b'{"error":{"message":"no such scenario"}}')
        elif body.get("stream"):
            self._send(200, "text/event-stream", sse)
        else:
            self._send(200, "application/json", whole)


def replay_backend():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Replay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


class Fleet:
    def __init__(self):
        self.procs = []
        self.servers = []
        self.tmp = tempfile.TemporaryDirectory()

    def spawn(self, args, name):
        log = open(os.path.join(self.tmp.name, f"{name}.log"), "w")
        self.procs.append((subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), log))

    def simulate(self, flavor, *extra):
        port = free_port()
        self.spawn([BIN, "simulate", "--flavor", flavor, "--port", str(port), "--model",
                    "sim-model", "--slot-ctx", "4096", "--token-delay-ms", "2", *extra],
                   f"sim-{flavor}")
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health")
        return url

    def serve(self, name, config):
        """`switchboard serve` of `config(port)` (the TOML for a free loopback port); its base
        URL once it answers /health."""
        port = free_port()
        path = os.path.join(self.tmp.name, f"{name}.toml")
        with open(path, "w") as f:
            f.write(config(port))
        self.spawn([BIN, "serve", "--config", path], name)
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/health")
        return base

    def close(self):
        for server in self.servers:
            server.shutdown()
        for p, log in self.procs:
            p.terminate()
        for p, log in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
            log.close()
        self.tmp.cleanup()


def ledgered_config(fleet, sim, env, more=""):
    """The config of a proxy of alias `small` on the simulator `sim`, an admin key and clients
    ann and bob (their keys in `{env}_ADMIN`, `{env}_ANN`, `{env}_BOB`), with a SQLite ledger
    in the fleet's temp dir; `more` TOML after it. A function of the port, for `Fleet.serve`."""
    db = os.path.join(fleet.tmp.name, "usage.db")
    return lambda port: f"""
[server]
listen = "127.0.0.1:{port}"
admin_keys_env = "{env}_ADMIN"

[backends.sim]
url = "{sim}"
flavor = "llamacpp"
slots = 4

[aliases.small]
backend = "sim"
upstream_model = "sim-model"

[clients.ann]
key_env = "{env}_ANN"
[clients.bob]
key_env = "{env}_BOB"

[ledger]
url = "sqlite://{db}"
batch_interval_ms = 10
{more}"""


@pytest.fixture(scope="session")
def proxy():
    """The proxy's base URL, its aliases: `native` (the backend's own Messages and Responses
    endpoints), `chat-only` (a backend's chat completions only: served by translation)."""
    fleet = Fleet()
    try:
        if BACKEND == "real":
            # The same server twice: its own Messages and Responses endpoints, and its chat
            # endpoint alone (`apis = ["chat"]`), so the translation is compared with what the
            # real server sends natively for the same request (greedy, so both say the same).
            native = os.environ["SDK_REAL_URL"]
            upstream, window = os.environ.get("SDK_REAL_MODEL", "tiny-qwen3"), 4096
            chat_only = f'url = "{native}"\nflavor = "llamacpp"\napis = ["chat"]'
            chat_upstream = upstream
            defaults = "defaults = { temperature = 0.0 }"
        else:
            native = fleet.simulate("llamacpp", "--reasoning", "--reasoning-tokens", "3")
            upstream, window = "sim-model", 4096
            url = fleet.simulate("openai", "--reasoning", "--reasoning-tokens", "3")
            chat_only = f'url = "{url}"\nflavor = "openai"'
            chat_upstream = "sim-model"
            defaults = ""
            replay = replay_backend()
            fleet.servers.append(replay)
        port = free_port()
        config = f"""
[server]
listen = "127.0.0.1:{port}"

[backends.native]
url = "{native}"
flavor = "llamacpp"
slots = 4

[backends.chat-only]
{chat_only}
slots = 4

[aliases.native]
backend = "native"
upstream_model = "{upstream}"
context_window = {window}
{defaults}

[aliases.chat-only]
backend = "chat-only"
upstream_model = "{chat_upstream}"
context_window = 4096
{defaults}
"""
        if fleet.servers:
            config += f"""
[backends.replay]
url = "http://127.0.0.1:{fleet.servers[0].server_address[1]}"
flavor = "openai"
slots = 4
"""
            for name in REPLAY:
                config += f"""
[aliases.replay-{name}]
backend = "replay"
upstream_model = "{name}"
context_window = 4096
"""
        path = os.path.join(fleet.tmp.name, "routes.toml")
        with open(path, "w") as f:
            f.write(config)
        fleet.spawn([BIN, "serve", "--config", path], "proxy")
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/health")
        yield base
    finally:
        fleet.close()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    stats = terminalreporter.stats
    counts = {k: len(stats.get(k, [])) for k in
              ("passed", "failed", "error", "xfailed", "xpassed", "skipped")}
    terminalreporter.write_line(
        f"sdk suite ({BACKEND}): " + ", ".join(f"{v} {k}" for k, v in counts.items()))


def pytest_sessionfinish(session, exitstatus):
    # No test collected is a broken suite, not a passing one.
    if exitstatus == 5:
        session.exitstatus = 1


def squeeze(types):
    """Event types with runs of the same delta type squeezed to one."""
    out = []
    for t in types:
        if not (t.endswith("delta") and out and out[-1] == t):
            out.append(t)
    return out


def dump(obj):
    return json.dumps(obj, default=str)[:2000]
