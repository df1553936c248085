"""The official `anthropic` SDK against the proxy's Messages API."""

import anthropic
import pytest

from conftest import sim_only, squeeze

LONG = "hello " * 6000
MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "Say hi."}]}]


@pytest.fixture(scope="module")
def client(proxy):
    return anthropic.Anthropic(base_url=proxy, api_key="none", max_retries=0)


def create(client, model):
    m = client.messages.create(model=model, max_tokens=8, system="Be brief.", messages=MESSAGES)
    assert m.type == "message" and m.role == "assistant"
    assert m.content, m
    assert m.stop_reason in ("max_tokens", "end_turn")
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0
    assert m.usage.output_tokens > 0
    return m


def stream(client, model):
    events = []
    with client.messages.stream(model=model, max_tokens=8, system="Be brief.",
                                messages=MESSAGES) as s:
        for ev in s:
            events.append(ev)
        final = s.get_final_message()
    assert events[0].type == "message_start"
    assert events[-1].type == "message_stop"
    text = "".join(e.delta.text for e in events
                   if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert "".join(b.text for b in final.content if b.type == "text") == text
    starts = [e.index for e in events if e.type == "content_block_start"]
    assert starts == list(range(len(final.content)))
    assert final.usage.output_tokens > 0
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) > 0
    return events, final


def test_messages_create(client):
    create(client, "native")


def test_messages_stream_to_the_end(client):
    events, final = stream(client, "native")
    assert final.stop_reason in ("max_tokens", "end_turn")


def test_messages_count_tokens(client):
    n = client.messages.count_tokens(model="native", messages=MESSAGES)
    assert n.input_tokens > 0


def test_unknown_model_is_anthropics_not_found(client):
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nope", max_tokens=4, messages=MESSAGES)
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("streamed", [False, True])
def test_over_the_window_is_invalid_request(client, streamed):
    with pytest.raises(anthropic.BadRequestError) as e:
        messages = [{"role": "user", "content": LONG}]
        if streamed:
            with client.messages.stream(model="native", max_tokens=8, messages=messages) as s:
                s.get_final_message()
        else:
            client.messages.create(model="native", max_tokens=8, messages=messages)
    assert e.value.body["error"]["type"] == "invalid_request_error", e.value.body


@pytest.mark.parametrize("streamed", [False, True])
def test_over_the_window_says_prompt_is_too_long(client, streamed):
    with pytest.raises(anthropic.BadRequestError) as e:
        messages = [{"role": "user", "content": LONG}]
        if streamed:
            with client.messages.stream(model="native", max_tokens=8, messages=messages) as s:
                s.get_final_message()
        else:
            client.messages.create(model="native", max_tokens=8, messages=messages)
    assert "prompt is too long" in str(e.value)


def test_messages_create_by_translation(client):
    create(client, "chat-only")


def test_messages_stream_by_translation_matches_the_native_stream(client):
    native, _ = stream(client, "native")
    translated, _ = stream(client, "chat-only")
    kinds = lambda evs: squeeze([e.type if e.type != "content_block_delta" else
                                 "content_block_delta:" + e.delta.type for e in evs])
    assert kinds(translated) == kinds(native)


# Chat answers of a replay backend translated (see conftest's REPLAY).

@sim_only
def test_interleaved_tool_calls_stream_each_into_its_own_tool_use_block(client):
    events = []
    with client.messages.stream(model="replay-interleaved", max_tokens=50,
                                messages=MESSAGES) as s:
        for ev in s:
            events.append(ev)
        final = s.get_final_message()
    starts = [e for e in events if e.type == "content_block_start"]
    assert [e.index for e in starts] == list(range(len(final.content)))
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use", "text", "tool_use"]
    weather, clock = final.content[2], final.content[4]
    assert (weather.id, weather.name) == ("call_w", "get_weather")
    assert weather.input == {"city": "Paris, Île-de-France"}
    assert clock.name == "get_time" and clock.id.startswith("toolu_")
    assert clock.input == {"tz": "Europe/Paris"}
    assert "".join(b.text for b in final.content if b.type == "text") == "Let me look. One moment."
    assert final.stop_reason == "tool_use"


@sim_only
def test_a_whole_answer_with_list_content_object_arguments_and_no_id(client):
    m = client.messages.create(model="replay-interleaved", max_tokens=50, messages=MESSAGES)
    assert [b.type for b in m.content] == ["text", "tool_use"]
    assert m.content[0].text == "ab"
    assert m.content[1].input == {"city": "Paris"}
    assert m.content[1].id.startswith("toolu_")


@sim_only
def test_an_answer_that_is_not_a_chat_completion_is_anthropics_api_error(client):
    with pytest.raises(anthropic.InternalServerError) as e:
        client.messages.create(model="replay-not-a-completion", max_tokens=50, messages=MESSAGES)
    assert e.value.status_code == 502
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "api_error"


@sim_only
@pytest.mark.parametrize("scenario", ["lone-surrogate", "not-utf8"])
def test_an_unreadable_event_is_an_error_the_sdk_raises(client, scenario):
    events = []
    with pytest.raises(anthropic.APIStatusError) as e:
        with client.messages.stream(model="replay-" + scenario, max_tokens=50,
                                    messages=MESSAGES) as s:
            for ev in s:
                events.append(ev)
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "api_error"
    assert events[0].type == "message_start"
    assert not any(ev.type == "message_delta" for ev in events)
