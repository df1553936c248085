"""The official `openai` SDK against the proxy's Responses API."""

import openai
import pytest

from conftest import sim_only, squeeze

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


# Chat answers of a replay backend translated (see conftest's REPLAY).

@sim_only
def test_interleaved_tool_calls_stream_each_into_its_own_function_call_item(client):
    events = []
    with client.responses.stream(model="replay-interleaved", input=INPUT,
                                 max_output_tokens=50) as s:
        for ev in s:
            events.append(ev)
        final = s.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [o.id for o in final.output] == [i.id for i in added]
    for e in events:
        if e.type.startswith("response.function_call_arguments."):
            assert added[e.output_index].type == "function_call"
            assert e.item_id == added[e.output_index].id
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(c.call_id, c.name) for c in calls][0] == ("call_w", "get_weather")
    assert calls[0].arguments == '{"city":"Paris, Île-de-France"}'
    assert calls[1].name == "get_time" and calls[1].call_id.startswith("call_")
    assert calls[1].arguments == '{"tz":"Europe/Paris"}'
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert done == [c.arguments for c in calls]
    assert final.output_text == "Let me look. One moment."
    assert [o.type for o in final.output] == [
        "reasoning", "message", "function_call", "message", "function_call"]


@sim_only
def test_a_whole_answer_with_list_content_object_arguments_and_no_id(client):
    r = client.responses.create(model="replay-interleaved", input=INPUT, max_output_tokens=50)
    assert r.output_text == "ab"
    call = [o for o in r.output if o.type == "function_call"][0]
    assert call.arguments == '{"city":"Paris"}'
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")


@sim_only
def test_an_answer_that_is_not_a_chat_completion_is_openais_bad_gateway(client):
    with pytest.raises(openai.InternalServerError) as e:
        client.responses.create(model="replay-not-a-completion", input=INPUT,
                                max_output_tokens=50)
    assert e.value.status_code == 502
    assert e.value.body["code"] == "bad_gateway", e.value.body


@sim_only
@pytest.mark.parametrize("scenario", ["lone-surrogate", "not-utf8"])
def test_an_unreadable_event_is_error_then_response_failed(client, scenario):
    events = []
    with client.responses.stream(model="replay-" + scenario, input=INPUT,
                                 max_output_tokens=50) as s:
        for ev in s:
            events.append(ev)
        with pytest.raises(RuntimeError):
            s.get_final_response()
    types = [e.type for e in events]
    assert types[-2:] == ["error", "response.failed"], types
    assert "response.completed" not in types
    assert events[-1].response.status == "failed"
    assert events[-2].code == "bad_gateway"
