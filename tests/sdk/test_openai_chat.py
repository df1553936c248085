"""The official `openai` SDK against the proxy's chat completions."""

import openai
import pytest

LONG = "hello " * 6000
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def client(proxy):
    return openai.OpenAI(base_url=proxy + "/v1", api_key="none", max_retries=0)


def test_chat_create(client):
    r = client.chat.completions.create(model="native", messages=MESSAGES, max_tokens=8)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0


def test_chat_stream_to_the_end_with_usage(client):
    chunks = list(client.chat.completions.create(
        model="native", messages=MESSAGES, max_tokens=8, stream=True,
        stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    finished = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finished) == 1, chunks
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_chat_stream_without_usage_asked_gets_none(client):
    chunks = list(client.chat.completions.create(
        model="native", messages=MESSAGES, max_tokens=8, stream=True))
    assert chunks and all(c.usage is None for c in chunks), chunks[-1]


def test_chat_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=MESSAGES, max_tokens=4)
    assert e.value.code == "model_not_found"


@pytest.mark.parametrize("streamed", [False, True])
def test_chat_over_the_window_is_context_length_exceeded(client, streamed):
    with pytest.raises(openai.BadRequestError) as e:
        r = client.chat.completions.create(
            model="native", messages=[{"role": "user", "content": LONG}], max_tokens=8,
            stream=streamed)
        if streamed:
            list(r)
    assert e.value.code == "context_length_exceeded", e.value.body
