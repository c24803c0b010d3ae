"""Which pruning stage drops the needle? Per layer and stage, whether the passkey's tokens survive for the
last query block of the prompt (the question), on the embedded model.

    python bench/needle_survival.py --length 65536 --depth 0.5 --model smol.gguf
"""

from __future__ import annotations

import argparse
import json

from infinitehip import LLM, EngineConfig, SamplingParams
from infinitehip.attention.infinitehip.method import InfiniteHiPAttention
from infinitehip.config.infinitehip import infinitehip_preset
from infinitehip.eval.passkey import make_passkey_sample


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--length", type=int, default=65536)
    p.add_argument("--depth", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--preset", default="3k")
    p.add_argument("--model", default=None)
    p.add_argument("--model-cache-dir", default=None)
    p.add_argument("--output", default=None)
    args = p.parse_args()

    config = infinitehip_preset(args.preset)
    llm = LLM(config=EngineConfig(model=args.model, model_cache_dir=args.model_cache_dir, method="infinitehip",
                                  max_context_tokens=args.length + 256, prefill_chunk_size=32768, show_progress=False),
              method_config=config)
    sample = make_passkey_sample(llm.tokenizer, args.length, args.depth, args.seed)
    text = llm.tokenizer.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)
    enc = llm.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    first = text.index(sample.answer)  # the key's first occurrence: inside the needle sentence
    needle = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < first + len(sample.answer) and b > first]
    total = len(enc["input_ids"])

    records: dict[tuple[int, int], bool] = {}
    method: InfiniteHiPAttention = llm.engine.method
    original = method._stage

    def stage(spec, blocks, parent, layer, seq, batch):
        out = original(spec, blocks, parent, layer, seq, batch)
        if seq.is_prefill and seq.context_len == total:  # the prompt's last chunk
            starts, lens = out.chunk_starts[-1], out.chunk_lens[-1]  # last query block: the question's end
            kept = any(bool(((starts <= t) & (t < starts + lens)).any()) for t in needle)
            s = [i for i, sp in enumerate(method._specs(layer, decode=False)) if sp == spec][0]
            records[(layer, s)] = kept
        return out

    method._stage = stage
    (out,) = llm.chat(sample.messages, SamplingParams(temperature=0.0, max_tokens=12))
    stages = config.num_stages
    print(f"passkey {sample.answer} at tokens {needle} of {total}; answer {out.text!r}")
    print("| layer | " + " | ".join(f"stage {s + 1}" for s in range(stages)) + " |")
    print("| --- |" + " --- |" * stages)
    for layer in range(llm.engine.model_config.num_layers):
        print(f"| {layer} | " + " | ".join({True: "kept", False: "DROPPED"}.get(records.get((layer, s)), "-") for s in range(stages)) + " |")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"answer": sample.answer, "output": out.text, "needle_tokens": needle, "total": total,
                       "kept": {f"{l}/{s}": k for (l, s), k in records.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
