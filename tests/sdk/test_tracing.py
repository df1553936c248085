"""Traces seen from an official SDK: the openai client sends a W3C `traceparent` (as an
OpenTelemetry-instrumented client does), and the proxy's spans, exported over OTLP to a
receiver here that decodes them with `opentelemetry-proto`, carry its trace id: the server
span as the client span's child, the attempt at the backend under it. Against the simulator
and against the real llama-server."""

import http.server
import os
import secrets
import threading
import time

import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from conftest import BACKEND, BIN, Fleet, free_port, wait_http


class Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP receiver: every export's spans, decoded."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.spans = []
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def wait_for(self, done, timeout=30.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.lock:
                spans = list(self.spans)
            if done(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"spans not as expected within {timeout}s: {spans}")


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        assert self.path == "/v1/traces", self.path
        assert self.headers["content-type"] == "application/x-protobuf"
        body = self.rfile.read(int(self.headers["content-length"]))
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        with self.server.lock:
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    self.server.spans.extend(ss.spans)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()


@pytest.fixture(scope="module")
def traced():
    """A proxy with tracing on, in front of the simulator or the real llama-server."""
    fleet = Fleet()
    receiver = Receiver()
    try:
        if BACKEND == "real":
            backend = os.environ["SDK_REAL_URL"]
            upstream = os.environ.get("SDK_REAL_MODEL", "tiny-qwen3")
        else:
            backend, upstream = fleet.simulate("llamacpp"), "sim-model"
        port = free_port()
        config = f"""
[server]
listen = "127.0.0.1:{port}"

[backends.b]
url = "{backend}"
flavor = "llamacpp"
slots = 4

[aliases.traced]
backend = "b"
upstream_model = "{upstream}"
context_window = 4096

[tracing]
otlp_endpoint = "http://127.0.0.1:{receiver.server_address[1]}"
export_interval_ms = 50
"""
        path = os.path.join(fleet.tmp.name, "traced.toml")
        with open(path, "w") as f:
            f.write(config)
        fleet.spawn([BIN, "serve", "--config", path], "traced-proxy")
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/health")
        yield base, receiver
    finally:
        receiver.shutdown()
        fleet.close()


@pytest.mark.parametrize("stream", [False, True])
def test_the_sdks_trace_id_is_on_the_proxy_and_attempt_spans(traced, stream):
    base, receiver = traced
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0,
                      default_headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    messages = [{"role": "user", "content": "Say hi."}]
    if stream:
        chunks = list(c.chat.completions.create(model="traced", messages=messages,
                                                max_tokens=5, stream=True))
        assert chunks
    else:
        answer = c.chat.completions.create(model="traced", messages=messages, max_tokens=5)
        assert answer.choices[0].message is not None

    def mine(spans):
        return [s for s in spans if s.trace_id.hex() == trace_id]

    spans = mine(receiver.wait_for(lambda s: any(x.kind == Span.SPAN_KIND_SERVER
                                                 for x in mine(s))))
    server = [s for s in spans if s.kind == Span.SPAN_KIND_SERVER]
    attempts = [s for s in spans if s.kind == Span.SPAN_KIND_CLIENT]
    assert len(server) == 1 and len(attempts) == 1, spans
    server, attempt = server[0], attempts[0]
    assert server.parent_span_id.hex() == parent
    assert attempt.parent_span_id == server.span_id
    assert server.name == "chat traced"
    attrs = {kv.key: kv.value for kv in server.attributes}
    assert attrs["gen_ai.operation.name"].string_value == "chat"
    assert attrs["gen_ai.request.model"].string_value == "traced"
    assert attrs["gen_ai.usage.output_tokens"].int_value > 0
    assert attrs["gen_ai.usage.input_tokens"].int_value > 0
    assert attrs["http.response.status_code"].int_value == 200
    assert "error.type" not in attrs
    attempt_attrs = {kv.key: kv.value for kv in attempt.attributes}
    assert attempt_attrs["gen_ai.provider.name"].string_value == "llamacpp"
    assert attempt_attrs["server.address"].string_value == "127.0.0.1"
