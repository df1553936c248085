"""The proxy and its backends for the official SDKs' tests.

Backends (SDK_BACKEND):
  sim   (default) simulated backends started here with `switchboard simulate`: llama.cpp for
        the native APIs, and a chat-only server (`flavor = "openai"`) for translation;
  real  the real llama-server at SDK_REAL_URL (started by .ci/sdk), natively and, for
        translation, its chat endpoint alone (`apis = ["chat"]`).
"""

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("SWITCHBOARD_BIN", os.path.join(ROOT, "target", "debug", "switchboard"))
BACKEND = os.environ.get("SDK_BACKEND", "sim")


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

    def close(self):
        for p, log in self.procs:
            p.terminate()
        for p, log in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
            log.close()
        self.tmp.cleanup()


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
