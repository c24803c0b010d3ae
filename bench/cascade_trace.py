"""Where a passkey's tokens go in the Cascading KV Cache: a diagnostic on the embedded model (CPU).

`python -m bench.cascade_trace --length 4096 --depths 0.3 0.7 --method-config '{"cache_tokens": 1792}'` builds a
passkey prompt per depth (the accuracy suite's seeds; the config over 64 sinks, 1024 cache, 4 sub-caches, stride 256),
runs the cascade with every push mirrored on token ids (the same plan and scores as the cache update, so each
(layer, KV head) knows which token each slot holds), and prints the answer, how many (layer, head) pairs keep each
of the key's digits, the most digits one pair keeps, at which push and sub-cache they were dropped, and the COMPAREs
a digit met (how many it won, its scores against its rivals'). `trace_passkey` returns each compare and drop.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

import torch

from infinitehip import LLM, EngineConfig, SamplingParams
from infinitehip.attention.methods.cascade import method as cascade_method
from infinitehip.attention.methods.cascade.config import CascadeConfig
from infinitehip.attention.methods.cascade.schedule import COMPARE, FILL, NONE, PASS
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.eval.passkey import make_passkey_sample
from infinitehip.eval.sample import prompt_token_ids
from infinitehip.model.gguf_convert import default_cache_root
from infinitehip.model.loading import load_model


class PushTracer:
    """Mirrors every cascade push on token ids: ids [L, Hkv, slots] (the token index each slot holds). `watch`: the
    token indices whose compares are logged (push, sub-cache, layer, head, ids, scores, winner)."""

    def __init__(self, config: CascadeConfig, L: int, Hkv: int, watch: set[int]):
        self.c, self.watch = config, watch
        # the first push: slot s holds token s (the prompt's first limit_tokens fill the slots in order)
        self.ids = torch.arange(config.limit_tokens).expand(L, Hkv, -1).clone()
        self.seen = config.sink_tokens  # tokens before the stride being pushed
        self.pushes = 0
        self.compares: list[dict[str, Any]] = []
        self.dropped: dict[tuple[int, int, int], dict[str, Any]] = {}  # (token, layer, head) -> where

    def subcache(self, slot: int) -> int:
        return (slot - self.c.sink_tokens) // self.c.subcache_tokens

    def push(self, scores: torch.Tensor, ops: torch.Tensor, slots: torch.Tensor, first: int) -> None:
        """scores [L, Hkv, slots] as the update reads them (before it)."""
        n = ops.shape[0]
        ids = self.ids
        if self.pushes:  # the stride's slots hold the tokens after the kept ones
            ids[..., first : first + n] = torch.arange(self.seen, self.seen + n)
        score = scores.clone()
        for j, (row_ops, row_slots) in enumerate(zip(ops.tolist(), slots.tolist())):
            carry, carry_score = ids[..., first + j].clone(), score[..., first + j].clone()
            for op, s in zip(row_ops, row_slots):
                if op == NONE:
                    break
                if op == COMPARE:
                    wins = carry_score >= score[..., s]
                    self._log(j, s, carry, carry_score, ids[..., s], score[..., s], wins)
                    ids[..., s] = torch.where(wins, carry, ids[..., s])
                    score[..., s] = torch.where(wins, carry_score, score[..., s])
                    break
                held, held_score = ids[..., s].clone(), score[..., s].clone()
                ids[..., s], score[..., s] = carry, carry_score
                if op == FILL:
                    break
                assert op == PASS
                carry, carry_score = held, held_score
            else:  # passed on after the last sub-cache: dropped
                self._drop(carry)
        self.score = score  # the update's scores afterwards (checked against it)
        self.seen += n
        self.pushes += 1

    def _log(self, j, slot, carry, carry_score, held, held_score, wins) -> None:
        for tok_tensor, other in ((carry, held), (held, carry)):
            hit = torch.isin(tok_tensor, torch.tensor(sorted(self.watch)))
            for l, h in hit.nonzero().tolist():
                self.compares.append(dict(push=self.pushes, j=j, subcache=self.subcache(slot), layer=l, head=h,
                                          carried=int(carry[l, h]), carried_score=float(carry_score[l, h]),
                                          newest=int(held[l, h]), newest_score=float(held_score[l, h]),
                                          carried_wins=bool(wins[l, h])))
                loser = held if wins[l, h] else carry
                if int(loser[l, h]) == int(tok_tensor[l, h]):
                    self.dropped[(int(tok_tensor[l, h]), l, h)] = dict(push=self.pushes, subcache=self.subcache(slot),
                                                                       by=int(other[l, h]))

    def _drop(self, carry: torch.Tensor) -> None:
        """carry [L, Hkv]: tokens passed on out of the last sub-cache."""
        hit = torch.isin(carry, torch.tensor(sorted(self.watch)))
        for l, h in hit.nonzero().tolist():
            self.dropped[(int(carry[l, h]), l, h)] = dict(push=self.pushes, subcache=self.c.num_subcaches, by=None)


def trace_passkey(length: int, depth: float, config: CascadeConfig, seed: int = 0, loaded=None,
                  max_tokens: int = 12) -> dict[str, Any]:
    loaded = loaded or load_model(None, default_cache_root(), torch.device("cpu"), torch.float32)
    tok = loaded.tokenizer
    sample = make_passkey_sample(tok, length, depth, length + round(depth * 100) + seed)  # the accuracy suite's seeds
    ids = prompt_token_ids(tok, sample.messages)
    is_digit = [tok.decode([t]).strip().isdigit() for t in ids]
    # The key's digits: runs of as many digit tokens as the key has digits (not the question's "5-digit")
    digits = [i for i in range(len(ids)) if any(all(is_digit[a : a + len(sample.answer)])
                                                 for a in range(max(0, i - len(sample.answer) + 1), i + 1))]
    mc = loaded.config
    tracer = PushTracer(config, mc.num_layers, mc.num_kv_heads, set(digits))
    real = cascade_method.cascade_update

    def traced(k, v, scores, flat_slots, ops, slots, first, impl):
        tracer.push(scores, ops, slots, first)
        real(k, v, scores, flat_slots, ops, slots, first, impl=impl)
        kept = config.kept_tokens
        assert torch.equal(tracer.score[..., :kept], scores[..., :kept]), "the mirror left the update's plan"

    cascade_method.cascade_update = traced
    try:
        engine = LLMEngine(EngineConfig(device="cpu", dtype="float32", show_progress=False, method="cascade",
                                        method_config=config), loaded)
        (out,) = LLM.from_engine(engine).chat(sample.messages, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    finally:
        cascade_method.cascade_update = real
    kept = tracer.ids[..., : config.kept_tokens]
    pairs = mc.num_layers * mc.num_kv_heads
    held = torch.stack([(kept == d).any(-1) for d in digits], -1)  # [L, Hkv, digits]
    kept_digits = {d: int(held[..., j].sum()) for j, d in enumerate(digits)}  # (layer, head) pairs holding d
    return dict(answer=sample.answer, output=out.text, correct=sample.is_correct(out.text), prompt_tokens=len(ids),
                digits={d: tok.decode([ids[d]]) for d in digits}, pairs=pairs, kept_digits=kept_digits,
                most_digits_one_head=int(held.sum(-1).max()),
                compares=tracer.compares, dropped=tracer.dropped, pushes=tracer.pushes, tracer=tracer)


def summary(r: dict[str, Any]) -> str:
    lines = [f"prompt {r['prompt_tokens']} tokens, key {r['answer']}, output {r['output']!r} "
             f"({'correct' if r['correct'] else 'wrong'}), {r['pushes']} pushes"]
    lines.append("digit tokens (index: digit, (layer, head) pairs of %d keeping it):" % r["pairs"])
    lines.append("  " + ", ".join(f"{d}:{ch} kept {r['kept_digits'][d]}" for d, ch in r["digits"].items()))
    lines.append(f"most key digits one (layer, head) holds: {r['most_digits_one_head']} of {len(r['digits'])}")
    where = Counter((v["push"], v["subcache"]) for v in r["dropped"].values())
    lines.append("drops of digit tokens by (push, sub-cache): " + ", ".join(f"{k}: {n}" for k, n in sorted(where.items())))
    comps = r["compares"]
    if comps:
        wins = sum(c["carried_wins"] == (c["carried"] in r["digits"]) for c in comps)
        lines.append(f"compares with a digit: {len(comps)}, the digit won {wins}")
        digit_scores = [c["carried_score"] if c["carried"] in r["digits"] else c["newest_score"] for c in comps]
        rival_scores = [c["newest_score"] if c["carried"] in r["digits"] else c["carried_score"] for c in comps]
        lines.append(f"  digit score mean {sum(digit_scores) / len(comps):.3e}, rival mean "
                     f"{sum(rival_scores) / len(comps):.3e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--depths", type=float, nargs="+", default=[0.3])
    p.add_argument("--method-config", type=json.loads, default={})
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    config = CascadeConfig(**{**dict(sink_tokens=64, cache_tokens=1024, num_subcaches=4, stride_tokens=256),
                              **args.method_config})
    loaded = load_model(None, default_cache_root(), torch.device("cpu"), torch.float32)
    for depth in args.depths:
        print(f"== depth {depth}")
        print(summary(trace_passkey(args.length, depth, config, args.seed, loaded)))


if __name__ == "__main__":
    main()
