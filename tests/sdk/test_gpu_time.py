"""GPU time as the official SDKs see it: a request whose predicted wait passes its deadline is
their 503 error with the Retry-After of the predicted wait, in each API's envelope; a client past
its GPU-seconds budget is their RateLimitError with the GPU-seconds headers. Simulator only (the
simulator's GPU mode; the deadlines and budgets are the proxy's own)."""

import http.client
import json
import os
import urllib.parse

import anthropic
import openai
import pytest

from conftest import BACKEND, BIN, Fleet, free_port, wait_http

pytestmark = pytest.mark.skipif(BACKEND == "real", reason="the proxy's own scheduling: simulator only")

HURRIED = "sdk-hurried-key"
THRIFTY = "sdk-thrifty-key"
MESSAGES = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def gpu():
    """A proxy on a one-slot simulated GPU decoding 20 tokens a second; client `hurried` may
    wait 60 s in its queue, client `thrifty` may spend one GPU-second a minute."""
    fleet = Fleet()
    try:
        sim = fleet.simulate("llamacpp", "--slots", "1", "--gpu-prefill-tps", "1000000",
                             "--gpu-decode-tps", "20")
        port = free_port()
        os.environ["SB_SDK_HURRIED_KEYS"] = HURRIED
        os.environ["SB_SDK_THRIFTY_KEYS"] = THRIFTY
        config = f"""
[server]
listen = "127.0.0.1:{port}"

[backends.gpu]
url = "{sim}"
flavor = "llamacpp"
slots = 1
prefill_tokens_per_s = 1000000
decode_tokens_per_s = 20

[aliases.small]
backend = "gpu"
upstream_model = "sim-model"
context_window = 4096

[clients.hurried]
key_env = "SB_SDK_HURRIED_KEYS"
priority = "batch"
max_queue_wait_ms = 60000

[clients.thrifty]
key_env = "SB_SDK_THRIFTY_KEYS"
gpu_seconds_per_minute = 1
"""
        path = os.path.join(fleet.tmp.name, "gpu.toml")
        with open(path, "w") as f:
            f.write(config)
        fleet.spawn([BIN, "serve", "--config", path], "gpu-proxy")
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/health")
        yield base
    finally:
        fleet.close()


@pytest.fixture
def slot_taken(gpu):
    """The one slot held by a streamed 400-token answer (20 s of decode predicted), cut at the
    end of the test."""
    body = {"model": "small", "messages": MESSAGES, "max_tokens": 400, "stream": True}
    u = urllib.parse.urlsplit(gpu)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"authorization": f"Bearer {HURRIED}", "content-type": "application/json"})
        # The head comes when the request has its slot.
        assert conn.getresponse().status == 200
        yield
    finally:
        # Its connection closed: the proxy cancels it at the backend.
        conn.close()


HURRY = {"x-switchboard-max-wait-ms": "1000"}


def test_openai_sdk_sees_503_wait_too_long_with_retry_after(gpu, slot_taken):
    c = openai.OpenAI(base_url=gpu + "/v1", api_key=HURRIED, max_retries=0)
    with pytest.raises(openai.InternalServerError) as e:
        c.chat.completions.create(model="small", messages=MESSAGES, max_tokens=8,
                                  extra_headers=HURRY)
    assert e.value.status_code == 503
    assert e.value.code == "wait_too_long"
    assert "predicted" in e.value.message
    assert 2 <= int(e.value.response.headers["retry-after"]) <= 25
    # The Responses API, the same envelope.
    with pytest.raises(openai.InternalServerError) as e:
        c.responses.create(model="small", input="Say hi.", max_output_tokens=16,
                           extra_headers=HURRY)
    assert e.value.status_code == 503
    assert e.value.code == "wait_too_long"


def test_anthropic_sdk_sees_503_overloaded_with_retry_after(gpu, slot_taken):
    c = anthropic.Anthropic(base_url=gpu, api_key=HURRIED, max_retries=0)
    with pytest.raises(anthropic.InternalServerError) as e:
        c.messages.create(model="small", max_tokens=8, messages=MESSAGES, extra_headers=HURRY)
    assert e.value.status_code == 503
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "overloaded_error"
    assert "predicted" in e.value.body["error"]["message"]
    assert 2 <= int(e.value.response.headers["retry-after"]) <= 25


def test_sdks_see_gpu_budget_as_rate_limit_error_with_its_headers(gpu):
    c = openai.OpenAI(base_url=gpu + "/v1", api_key=THRIFTY, max_retries=0)
    # 12 tokens at 20 a second: 0.6 GPU-seconds measured.
    raw = c.chat.completions.with_raw_response.create(model="small", messages=MESSAGES,
                                                      max_tokens=12)
    assert raw.headers["x-switchboard-ratelimit-limit-gpu-seconds"] == "1.000"
    assert float(raw.headers["x-switchboard-ratelimit-remaining-gpu-seconds"]) <= 1.0
    # Its next answer is expected as long as its last: 0.6 s more does not fit.
    with pytest.raises(openai.RateLimitError) as e:
        c.chat.completions.create(model="small", messages=MESSAGES, max_tokens=12)
    assert e.value.status_code == 429
    assert e.value.code == "rate_limit_exceeded"
    assert "GPU-seconds per minute" in e.value.message
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 60
    assert float(e.value.response.headers["x-switchboard-ratelimit-remaining-gpu-seconds"]) < 0.6
    a = anthropic.Anthropic(base_url=gpu, api_key=THRIFTY, max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as e:
        a.messages.create(model="small", max_tokens=12, messages=MESSAGES)
    assert e.value.body["error"]["type"] == "rate_limit_error"
    assert "x-switchboard-ratelimit-reset-gpu-seconds" in e.value.response.headers
