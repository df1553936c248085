#!/usr/bin/env python3
"""Agent conversations replayed through one or more Switchboard processes taking turns.

Each conversation is an agent's: one system prompt shared by all, its own task, then turns
that each add the model's answer and a tool result (so every prompt repeats the one before and
grows). The conversations run at once; each request goes to the next proxy in turn (requests
alternate between the processes, as a Service spreads them over pods). Prints one JSON line:
the prompt tokens of every turn after the first, how many of them the backend took from its
cache (llama-server's `timings.cache_n`, else `usage.prompt_tokens_details.cached_tokens`),
and that share in percent.

    driver.py --proxy http://127.0.0.1:7701 [--proxy http://127.0.0.1:7702] [--seed 1]
"""

import argparse
import itertools
import json
import random
import sys
import threading
import time
import urllib.request

WORDS = (
    "the of and to in is that for it as with was on be at by this had not are but from or "
    "have an they which one you were her all she there would their we him been has when who "
    "will more no if out so said what up its about into than them can only other new some "
    "could time these two may then do first any my now such like our over man me even most "
    "made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another know "
    "while last might us great old year off come since against go came right used take three"
).split()


def text(rng, words):
    """`words` words of prose-like noise."""
    out = []
    for i in range(words):
        out.append(rng.choice(WORDS))
        if i % 14 == 13:
            out[-1] += "."
    return " ".join(out)


def post(url, body, timeout):
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def cached_and_prompt(answer):
    """(cached, total) prompt tokens of one answer."""
    t = answer.get("timings") or {}
    if "cache_n" in t and "prompt_n" in t:
        return t["cache_n"], t["cache_n"] + t["prompt_n"]
    u = answer.get("usage") or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return cached, u.get("prompt_tokens", 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proxy", action="append", required=True, help="a Switchboard's base URL")
    ap.add_argument("--model", default="m")
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system-words", type=int, default=300)
    ap.add_argument("--task-words", type=int, default=60)
    ap.add_argument("--tool-words", type=int, default=250, help="words of tool result per turn")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()

    system = text(random.Random(f"system-{a.seed}"), a.system_words)
    order = itertools.count()
    lock = threading.Lock()
    results = []  # (conversation, turn, cached, prompt, seconds)
    errors = []

    def next_proxy():
        with lock:
            return a.proxy[next(order) % len(a.proxy)]

    def agent(conv):
        rng = random.Random(f"agent-{a.seed}-{conv}")
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Task {conv}: " + text(rng, a.task_words)},
        ]
        for turn in range(a.turns):
            body = {
                "model": a.model,
                "messages": messages,
                "max_tokens": a.max_tokens,
                "temperature": 0,
                "seed": a.seed,
            }
            t0 = time.monotonic()
            try:
                answer = post(next_proxy(), body, a.timeout)
            except Exception as e:  # noqa: BLE001 - reported, the run fails
                errors.append(f"conversation {conv} turn {turn}: {e}")
                return
            cached, prompt = cached_and_prompt(answer)
            with lock:
                results.append((conv, turn, cached, prompt, time.monotonic() - t0))
            reply = (answer["choices"][0]["message"].get("content") or "").strip()
            messages.append({"role": "assistant", "content": reply or "ok"})
            messages.append({"role": "user", "content": "Tool result: " + text(rng, a.tool_words)})

    threads = [threading.Thread(target=agent, args=(c,)) for c in range(a.conversations)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    later = [r for r in results if r[1] > 0]
    cached = sum(r[2] for r in later)
    prompt = sum(r[3] for r in later)
    print(
        json.dumps(
            {
                "proxies": len(a.proxy),
                "seed": a.seed,
                "requests": len(results),
                "prompt_tokens_after_first": prompt,
                "cached_tokens_after_first": cached,
                "cached_share_pct": round(100.0 * cached / prompt, 2) if prompt else None,
                "seconds": round(sum(r[4] for r in results), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
