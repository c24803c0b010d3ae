"""Which RULER prompts hold a stage-1 chunk of repeated text, the chunks `hierarchy_repeat_span` leaves out: the ids of
every code-word prompt of the given result files up to --max-length, rebuilt on the CPU with the Gemma 3 tokenizer.

    python -m bench.repeat_chunks RESULT.json ... [--max-length 131072]

Prints per prompt (file, length, seed, depth, tokens in a repeated 32-token window, all-repeated stage-1 chunks) and
the totals. A prompt with no all-repeated chunk is selected exactly as with the setting off."""

from __future__ import annotations

import argparse
import json

import torch

from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.attention.methods.infinitehip.repeated_chunks import novel_chunks
from infinitehip.attention.common.repeated_text import repeated_tokens
from infinitehip.engine.prompt_format import chat_prompt_ids
from infinitehip.eval.ruler.tasks import make_ruler_sample
from infinitehip.model.builtin import gemma3_270m_path
from infinitehip.model.gguf_convert import convert_gguf, default_cache_root
from infinitehip.model.loading import load_tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="eval ruler result JSON files (their samples are rebuilt)")
    p.add_argument("--max-length", type=int, default=131072, help="only samples up to this --lengths value")
    args = p.parse_args()
    c = InfiniteHiPConfig()
    tokenizer = load_tokenizer(convert_gguf(gemma3_270m_path(), default_cache_root()))
    counts = [0, 0, 0]  # prompts, with a repeated token, with an all-repeated chunk
    for path in args.files:
        for s in json.loads(open(path).read())["samples"]:
            if s["length"] > args.max_length or s["task"] != "niah_single_word":
                continue
            sample = make_ruler_sample(tokenizer, s["task"], s["haystack"], s["length"], s["depth"], s["seed"],
                                       bool(s.get("haystack_start")), s.get("haystack_span") or 0)
            ids = chat_prompt_ids(tokenizer, sample.messages)
            if len(ids) != s["prompt_tokens"]:
                raise SystemExit(f"{path}: rebuilt {len(ids)} tokens, the run had {s['prompt_tokens']}")
            repeated = repeated_tokens(torch.tensor(ids), c.hierarchy_repeat_span)
            # stage-1 candidates of the prompt's last query: [sink, T - stream)
            chunks = novel_chunks(repeated[c.sink_tokens : len(ids) - c.stream_tokens], c.chunk_sizes[0])
            marked, left_out = int(repeated.sum()), int((~chunks).sum())
            counts = [counts[0] + 1, counts[1] + (marked > 0), counts[2] + (left_out > 0)]
            print(path.rsplit("/", 1)[-1], s["length"], s["seed"], s["depth"], marked, left_out, flush=True)
    print(f"prompts {counts[0]}, with a repeated token {counts[1]}, with an all-repeated chunk {counts[2]}")


if __name__ == "__main__":
    main()
