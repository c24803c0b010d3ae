"""Where a needle's tokens go in the Cascading KV Cache: a diagnostic (CPU).

`python -m bench.cascade_trace --length 4096 --depths 0.3 0.7 --method-config '{"cache_tokens": 1792}'` builds a
passkey prompt per depth on the embedded model (the accuracy suite's seeds; the config over 64 sinks, 1024 cache,
4 sub-caches, stride 256); `--task niah_single_word --haystack sotu --model gemma3-270m --length 32000` a RULER
sample (the suite's seed-0 sample of that depth) on the model named, with the method's own config unless
--method-config names fields. It runs the cascade with every push mirrored on token ids (the same plan and scores
as the cache update, so each (layer, KV head) knows which token each slot holds) and checks, at every push and
per (layer, head), that the kept slots' positions are their tokens' order, and at the prompt's last chunk that it
attends every slot (sinks + sub-caches + stride). It prints the answer, how many (layer, head) pairs keep each
watched token (the key's digits; the needle sentence's tokens) and in which sub-cache, the most one pair keeps, at
which push and sub-cache they were dropped, and the COMPAREs they met (how many they won, their scores against
their rivals'). `trace_passkey` / `trace_ruler` return each compare and drop.
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
from infinitehip.eval.ruler.positions import needle_token_positions
from infinitehip.eval.ruler.runner import sample_seed
from infinitehip.eval.ruler.tasks import make_ruler_sample
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
        self.held = torch.arange(config.kept_tokens)  # the kept slots holding a token (after the last push)

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

    def check_positions(self, positions: torch.Tensor, held: torch.Tensor | None) -> None:
        """positions [kept] (schedule.positions() after a push), held (schedule.held_slots(): the slots holding a
        token, None: all): every (layer, head)'s held slots, ranked by the token each holds, must be at positions
        0, 1, ... (the method rotates slot s at positions[s] and attends the held slots alone)."""
        held = torch.arange(self.c.kept_tokens) if held is None else held
        tokens = self.ids[..., held]
        rank = tokens.argsort(-1).argsort(-1)  # [L, Hkv, held] each slot's rank by token order
        if not torch.equal(rank, positions[held].expand_as(rank)):
            raise AssertionError(f"push {self.pushes}: a held slot's position is not its token's order")
        self.held = held

    def subcache_of(self, token: int) -> torch.Tensor:
        """[L, Hkv] the sub-cache holding `token` in each (layer, head) (held slots only): -1 sinks, C absent."""
        kept = self.ids[..., self.held] == token
        where = torch.full(kept.shape[:2], self.c.num_subcaches, dtype=torch.long)
        for l, h, i in kept.nonzero().tolist():
            slot = int(self.held[i])
            where[l, h] = -1 if slot < self.c.sink_tokens else self.subcache(slot)
        return where

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


def trace_prompt(loaded, messages, watch: list[int], config: CascadeConfig, max_tokens: int = 12) -> dict[str, Any]:
    """Run the cascade over a chat prompt with every push mirrored (PushTracer, watching token indices `watch`)
    -> the output, the tracer, and where each watched token is held at the end."""
    mc = loaded.config
    view = mc.method_view() if mc.sliding_layers else mc  # the method governs the full-attention layers alone
    config = cascade_method.sized_config(view, config)
    tracer = PushTracer(config, view.num_layers, view.num_kv_heads, set(watch))
    real, real_prefill = cascade_method.cascade_update, cascade_method.CascadeAttention.prefill
    last_chunk: dict[str, int] = {}

    def traced(k, v, scores, flat_slots, ops, slots, first, impl):
        tracer.push(scores, ops, slots, first)
        real(k, v, scores, flat_slots, ops, slots, first, impl=impl)
        kept = config.kept_tokens
        assert torch.equal(tracer.score[..., :kept], scores[..., :kept]), "the mirror left the update's plan"

    def prefill(self, layer, q, seq, batch):
        out = real_prefill(self, layer, q, seq, batch)
        if layer == 0 and seq.ends_prompt:  # the question's chunk: what it attended
            state = seq.state
            held = state.schedule.held_slots()
            last_chunk.update(start=seq.start_pos, end=seq.context_len, pushed=state.schedule.pushed,
                              held=config.kept_tokens if held is None else held.numel(),
                              keys=seq.context_len if state.key_slots is None else state.key_slots.numel())
        return out

    def after_push(self, seq):
        kept = real_push(self, seq)
        tracer.check_positions(seq.state.schedule.positions(), seq.state.schedule.held_slots())
        return kept

    real_push = cascade_method.CascadeAttention._push
    cascade_method.cascade_update = traced
    cascade_method.CascadeAttention.prefill = prefill
    cascade_method.CascadeAttention._push = after_push
    try:
        engine = LLMEngine(EngineConfig(device="cpu", dtype="float32", show_progress=False, method="cascade",
                                        method_config=config), loaded)
        (out,) = LLM.from_engine(engine).chat(messages, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    finally:
        cascade_method.cascade_update = real
        cascade_method.CascadeAttention.prefill = real_prefill
        cascade_method.CascadeAttention._push = real_push
    # The question's chunk attends the sinks, the sub-caches' tokens (once pushed) and the stride so far
    if last_chunk["pushed"]:
        assert last_chunk["start"] >= config.kept_tokens, last_chunk
        assert last_chunk["keys"] == last_chunk["held"] + last_chunk["end"] - config.kept_tokens, last_chunk
    else:
        assert last_chunk["keys"] == last_chunk["end"], last_chunk
    where = {t: tracer.subcache_of(t) for t in watch if t < tracer.seen}  # the rest: in the question's stride
    return dict(output=out.text, tracer=tracer, where=where, last_chunk=last_chunk, config=config)


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
    run = trace_prompt(loaded, sample.messages, digits, config, max_tokens)
    return _result(run, ids, tok, digits, sample.answer, sample.is_correct(run["output"]))


def trace_ruler(length: int, depth: float, haystack: str, config: CascadeConfig, loaded, task: str = "niah_single_word",
                haystack_dir: str | None = None, max_tokens: int = 24) -> dict[str, Any]:
    """The RULER suite's seed-0 sample (`sample_seed(0, 0, depth)`), its needle sentences' tokens watched."""
    tok = loaded.tokenizer
    sample = make_ruler_sample(tok, task, haystack, length, depth, sample_seed(0, 0, depth), haystack_dir=haystack_dir)
    ids = prompt_token_ids(tok, sample.messages)
    needle = needle_token_positions(tok, sample.messages, sample.needle_texts)
    run = trace_prompt(loaded, sample.messages, needle, config, max_tokens)
    return _result(run, ids, tok, needle, " ".join(sample.expected), sample.is_correct(run["output"]))


def _result(run: dict[str, Any], ids: list[int], tok, watch: list[int], answer: str, correct: bool) -> dict[str, Any]:
    tracer, config = run["tracer"], run["config"]
    kept = tracer.ids[..., tracer.held]  # the held slots (a filling sub-cache's others hold no token of it)
    pairs = kept.shape[0] * kept.shape[1]
    held = torch.stack([(kept == d).any(-1) for d in watch], -1)  # [L, Hkv, watched]
    in_stride = [d for d in watch if d >= tracer.seen]  # after the last push: attended by the question as is
    return dict(answer=answer, output=run["output"], correct=correct, prompt_tokens=len(ids),
                digits={d: tok.decode([ids[d]]) for d in watch}, pairs=pairs,
                kept_digits={d: int(held[..., j].sum()) for j, d in enumerate(watch)},
                most_digits_one_head=int(held.sum(-1).max()), in_stride=in_stride,
                where={d: Counter(w.flatten().tolist()) for d, w in run["where"].items()},
                last_chunk=run["last_chunk"], compares=tracer.compares, dropped=tracer.dropped,
                pushes=tracer.pushes, tracer=tracer, config=config)


def summary(r: dict[str, Any]) -> str:
    c, last = r["config"], r["last_chunk"]
    lines = [f"prompt {r['prompt_tokens']} tokens, answer {r['answer']}, output {r['output']!r} "
             f"({'correct' if r['correct'] else 'wrong'}), {r['pushes']} pushes; cache {c.sink_tokens} sinks + "
             f"{c.num_subcaches} x {c.subcache_tokens}, stride {c.stride_tokens}"]
    lines.append(f"the question's chunk: queries at slots {last['start']}..{last['end'] - 1} attend {last['keys']} keys "
                 f"({last['held']} of {c.kept_tokens} kept slots hold a token, then the stride); positions = token "
                 f"order at every push, every (layer, head)")
    lines.append("watched tokens (index:token kept by how many of %d (layer, head) pairs; where: sub-cache -> "
                 "pairs, %d = dropped, -1 = sinks):" % (r["pairs"], c.num_subcaches))
    for d, ch in r["digits"].items():
        where = "in the question's stride" if d in r["in_stride"] else dict(sorted(r["where"][d].items()))
        lines.append(f"  {d}:{ch!r} kept {r['kept_digits'][d] if d not in r['in_stride'] else r['pairs']} {where}")
    lines.append(f"most watched tokens one (layer, head) holds: {r['most_digits_one_head']} of {len(r['digits'])} "
                 f"({len(r['in_stride'])} in the stride)")
    where = Counter((v["push"], v["subcache"]) for v in r["dropped"].values())
    lines.append("drops of watched tokens by (push, sub-cache): " + ", ".join(f"{k}: {n}" for k, n in sorted(where.items())))
    comps = r["compares"]
    if comps:
        wins = sum(c["carried_wins"] == (c["carried"] in r["digits"]) for c in comps)
        lines.append(f"compares with a watched token: {len(comps)}, the watched token won {wins}")
        digit_scores = [c["carried_score"] if c["carried"] in r["digits"] else c["newest_score"] for c in comps]
        rival_scores = [c["newest_score"] if c["carried"] in r["digits"] else c["carried_score"] for c in comps]
        lines.append(f"  watched score mean {sum(digit_scores) / len(comps):.3e}, rival mean "
                     f"{sum(rival_scores) / len(comps):.3e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="passkey", help="passkey (embedded model) or a RULER needle task")
    p.add_argument("--model", default="embedded", help="embedded or a model the package loads (gemma3-270m)")
    p.add_argument("--haystack", default="sotu", help="RULER tasks: the haystack")
    p.add_argument("--haystack-dir", default=None, help="RULER tasks: exported haystack texts")
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--depths", type=float, nargs="+", default=[0.3])
    p.add_argument("--method-config", type=json.loads, default={})
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from bench.common import models

    loaded = models.load(args.model, torch.device("cpu"), torch.float32)
    for depth in args.depths:
        print(f"== depth {depth}")
        if args.task == "passkey":
            config = CascadeConfig(**{**dict(sink_tokens=64, cache_tokens=1024, num_subcaches=4, stride_tokens=256),
                                      **args.method_config})
            print(summary(trace_passkey(args.length, depth, config, args.seed, loaded)))
        else:
            config = CascadeConfig(**args.method_config)  # the method's own sizes unless given
            print(summary(trace_ruler(args.length, depth, args.haystack, config, loaded, args.task, args.haystack_dir)))


if __name__ == "__main__":
    main()
