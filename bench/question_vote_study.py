"""How much of a real-prose needle does a vote put in the top-B selection? (question-time selection study)

Runs one code-word needle prompt (bench/needle_screen.py) through `tokenselect` with question-time selection on,
captures per layer the last question queries and every candidate key as the selection sees them, then scores
the candidates offline under several rules: the last N prompt queries (N = 1: one decode-like query), each
query's soft vote on raw logits summed, averaged over a centred window of W tokens and spread by a max over the
same width (attention/question_selection.py). Prints, per rule, the mean over layers of the share of the needle's
tokens and of its value tokens (the code word) in the top B, and how many layers hold any value token.

    python bench/question_vote_study.py --length 16384 --depth 0.5 --seed 0 --budget 2048 --output study.json
"""

from __future__ import annotations

import argparse
import json

import torch

from infinitehip.attention.question_selection import window_scores
from infinitehip.attention.tokenselect import method as ts_method
from infinitehip.config.sampling import SamplingParams
from infinitehip.config.tokenselect import TokenSelectConfig
from infinitehip.engine.llm import LLM
from infinitehip.kv.paged_cache import token_slots
from infinitehip.model.rope import apply_rotary
from needle_screen import needle_positions, needle_sample


def capture(llm: LLM, messages: list[dict]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer: the question queries [n, H, d] (pre-RoPE) and the keys of tokens [0, limit) [limit, Hkv, d]."""
    layers, inner = [], ts_method.question_tokens

    def hook(q, k_flat, page_table, page_size, sink, limit, *args, **kwargs):
        keys = k_flat[token_slots(page_table, torch.arange(limit, device=q.device), page_size)]
        layers.append((q.float().cpu(), keys.float().cpu()))
        return inner(q, k_flat, page_table, page_size, sink, limit, *args, **kwargs)

    ts_method.question_tokens = hook
    try:
        llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=1))
    finally:
        ts_method.question_tokens = inner
    return layers


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--length", type=int, default=16384)
    p.add_argument("--depth", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--queries", type=int, nargs="+", default=[1, 16, 32, 64])
    p.add_argument("--windows", type=int, nargs="+", default=[1, 5, 9, 15])
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    config = TokenSelectConfig(question_tokens=max(args.queries))
    llm = LLM(model=args.model, method="tokenselect", method_config=config, device=args.device,
              max_context_tokens=args.length + 256, show_progress=False)
    messages, needle, value = needle_sample(llm.tokenizer, args.length, args.depth, args.seed)
    ids = llm.engine.encode_chat(messages)
    needle_pos = torch.tensor(needle_positions(llm.tokenizer, messages, needle))
    value_pos = torch.tensor([p for p in needle_pos.tolist()
                              if llm.tokenizer.decode([ids[p]]).strip() and llm.tokenizer.decode([ids[p]]).strip() in value])
    sink, distance = config.sink_tokens, config.local_tokens
    rope = llm.engine.runner.rope
    rope.ensure(distance + 1)
    cos, sin = rope.cos[distance].float().cpu(), rope.sin[distance].float().cpu()
    shares: dict[str, list[tuple[float, float]]] = {}
    for q, keys in capture(llm, messages):
        k = keys[sink:]
        group = q.shape[1] // k.shape[1]
        logits = torch.einsum("nhd,khd->nhk", apply_rotary(q, cos, sin), k.repeat_interleave(group, dim=1))  # raw q.k
        for n in args.queries:
            votes = torch.softmax(logits[-n:], dim=-1).sum((0, 1))
            for w in args.windows:
                top = torch.topk(window_scores(votes, w), args.budget).indices + sink
                shares.setdefault(f"queries={n} window={w}", []).append(
                    (float(torch.isin(needle_pos, top).float().mean()), float(torch.isin(value_pos, top).float().mean())))
    rows = [{"rule": rule, "needle_share": sum(a for a, _ in v) / len(v), "value_share": sum(b for _, b in v) / len(v),
             "layers_with_value": sum(b > 0 for _, b in v)} for rule, v in shares.items()]
    print(f"length {args.length} depth {args.depth} seed {args.seed} value {value!r} budget {args.budget}")
    print("| rule | needle tokens in top B | value tokens in top B | layers holding a value token |")
    print("| --- | :-: | :-: | :-: |")
    for r in rows:
        print(f"| {r['rule']} | {r['needle_share']:.2f} | {r['value_share']:.2f} | {r['layers_with_value']} |")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"length": args.length, "depth": args.depth, "seed": args.seed, "budget": args.budget,
                       "value": value, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
