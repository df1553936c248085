"""The official `openai` SDK against the proxy's Responses API."""

import openai
import pytest

from conftest import squeeze

LONG = "hello " * 6000
INPUT = [{"type": "message", "role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def client(proxy):
    return openai.OpenAI(base_url=proxy + "/v1", api_key="none", max_retries=0)


def create(client, model):
    r = client.responses.create(model=model, input=INPUT, instructions="Be brief.",
                                max_output_tokens=8)
    assert r.object == "response"
    assert r.status == "completed"
    assert r.output, r
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    return r


def stream(client, model):
    events = []
    with client.responses.stream(model=model, input=INPUT, instructions="Be brief.",
                                 max_output_tokens=8) as s:
        for ev in s:
            events.append(ev)
        final = s.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert [o.id for o in final.output] == added
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    return events, final


def test_responses_create(client):
    create(client, "native")


def test_responses_stream_to_the_end(client):
    events, final = stream(client, "native")
    assert final.status == "completed"


def test_responses_input_tokens_count(client):
    n = client.responses.input_tokens.count(model="native", input=INPUT)
    assert n.input_tokens > 0


def test_unknown_model_is_openais_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="nope", input="hi", max_output_tokens=4)
    assert e.value.code == "model_not_found"


@pytest.mark.parametrize("streamed", [False, True])
def test_over_the_window_is_context_length_exceeded(client, streamed):
    with pytest.raises(openai.BadRequestError) as e:
        if streamed:
            with client.responses.stream(model="native", input=LONG, max_output_tokens=8) as s:
                s.get_final_response()
        else:
            client.responses.create(model="native", input=LONG, max_output_tokens=8)
    assert e.value.code == "context_length_exceeded", e.value.body


def test_responses_create_by_translation(client):
    create(client, "chat-only")


def test_responses_stream_by_translation_matches_the_native_stream(client):
    native, _ = stream(client, "native")
    translated, _ = stream(client, "chat-only")
    assert squeeze([e.type for e in translated]) == squeeze([e.type for e in native])
