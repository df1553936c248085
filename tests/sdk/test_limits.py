"""A client's limits as the official SDKs see them: the 429 is their RateLimitError, with the
Retry-After they parse and the rate-limit headers they read. Simulator only (the limits are
the proxy's own; a real backend adds nothing here)."""

import os

import anthropic
import openai
import pytest

from conftest import BACKEND, Fleet

pytestmark = pytest.mark.skipif(BACKEND == "real", reason="the proxy's own limits: simulator only")

KEY = "sdk-limited-key"
DAILY = "sdk-daily-key"


@pytest.fixture(scope="module")
def limited():
    """A proxy whose client `sdk` may spend 100 tokens a minute, and `daily` 100 a day."""
    fleet = Fleet()
    try:
        sim = fleet.simulate("llamacpp")
        os.environ["SB_SDK_LIMITED_KEYS"] = KEY
        os.environ["SB_SDK_DAILY_KEYS"] = DAILY
        config = lambda port: f"""
[server]
listen = "127.0.0.1:{port}"

[backends.sim]
url = "{sim}"
flavor = "llamacpp"
slots = 4

[aliases.small]
backend = "sim"
upstream_model = "sim-model"
context_window = 4096

[clients.sdk]
key_env = "SB_SDK_LIMITED_KEYS"
tokens_per_minute = 100

[clients.daily]
key_env = "SB_SDK_DAILY_KEYS"
tokens_per_day = 100
"""
        yield fleet.serve("limited-proxy", config)
    finally:
        fleet.close()


MESSAGES = [{"role": "user", "content": "Say hi."}]


def test_openai_sdk_gets_rate_limit_error_with_retry_after(limited):
    c = openai.OpenAI(base_url=limited + "/v1", api_key=KEY, max_retries=0)
    raw = c.chat.completions.with_raw_response.create(model="small", messages=MESSAGES, max_tokens=60)
    assert raw.headers["x-ratelimit-limit-tokens"] == "100"
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) < 40
    with pytest.raises(openai.RateLimitError) as e:
        c.chat.completions.create(model="small", messages=MESSAGES, max_tokens=95)
    assert e.value.status_code == 429
    assert e.value.code == "rate_limit_exceeded"
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 60
    # More than the whole budget: never fits, and says so without inviting a retry.
    with pytest.raises(openai.RateLimitError) as e:
        c.chat.completions.create(model="small", messages=MESSAGES, max_tokens=500)
    assert "retry-after" not in e.value.response.headers
    assert "can never fit" in str(e.value)


def test_anthropic_sdk_gets_rate_limit_error_with_retry_after(limited):
    c = anthropic.Anthropic(base_url=limited, api_key=KEY, max_retries=0)
    try:
        c.messages.create(model="small", max_tokens=60, messages=MESSAGES)
    except anthropic.RateLimitError:
        pass  # the budget is spent already (by the test before)
    with pytest.raises(anthropic.RateLimitError) as e:
        c.messages.create(model="small", max_tokens=95, messages=MESSAGES)
    assert e.value.status_code == 429
    assert e.value.body["error"]["type"] == "rate_limit_error"
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 60
    assert e.value.response.headers["anthropic-ratelimit-tokens-limit"] == "100"


def test_a_spent_day_is_insufficient_quota_until_midnight_in_both_sdks(limited):
    c = openai.OpenAI(base_url=limited + "/v1", api_key=DAILY, max_retries=0)
    raw = c.chat.completions.with_raw_response.create(model="small", messages=MESSAGES, max_tokens=60)
    assert raw.headers["x-ratelimit-limit-tokens"] == "100"
    with pytest.raises(openai.RateLimitError) as e:
        c.chat.completions.create(model="small", messages=MESSAGES, max_tokens=95)
    assert e.value.status_code == 429
    assert e.value.code == "insufficient_quota"
    assert "resets at the start of the next day" in str(e.value)
    # Until the day's end (UTC): at most a day.
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 86400
    a = anthropic.Anthropic(base_url=limited, api_key=DAILY, max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as e:
        a.messages.create(model="small", max_tokens=95, messages=MESSAGES)
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "rate_limit_error"
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 86400
    assert e.value.response.headers["anthropic-ratelimit-tokens-limit"] == "100"


def test_unknown_key_is_authentication_error(limited):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=limited + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=limited, api_key="wrong", max_retries=0).messages.create(
            model="small", max_tokens=4, messages=MESSAGES)
