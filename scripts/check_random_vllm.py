#!/usr/bin/env python3
"""Cross-check the local vLLM-flavour counts of 200 random conversations against vLLM's
preprocessing + HF transformers (the same reference as record_counts.py).

  TOKENS_DUMP=random.json cargo test --test it tokens::dump_random -- --ignored
  check_random_vllm.py --tokenizer-dir DIR random.json
"""
import argparse
import json

import record_counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("dump")
    args = ap.parse_args()
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.tokenizer_dir)
    with open(args.dump, encoding="utf-8") as f:
        data = json.load(f)
    bad = []
    for d in data:
        want = record_counts.vllm_count(tokenizer, d["body"])
        if want != d["local"]:
            bad.append((d["seed"], d["local"], want))
    print(f"{len(data)} conversations, {len(bad)} mismatches")
    for seed, local, want in bad:
        print(f"seed {seed}: local {local}, reference {want}")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
