"""Shared set-up of the passkey probes (`tokenselect_selection_study.py`, `infinipot_needle_trace.py`): the
command-line arguments, the engine, the sweep's prompt for one length and depth, and where its needle's digit
tokens are, so a probe's spies can look for them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from infinitehip import LLM, EngineConfig
from infinitehip.eval.passkey import make_passkey_sample
from infinitehip.eval.sample import EvalSample


@dataclass
class PasskeyProbe:
    llm: LLM
    sample: EvalSample
    seed: int
    ids: list[int]  # the templated prompt's token ids
    needle: list[int]  # ascending positions of the needle's digit tokens (both copies of the key)


def add_probe_args(p: argparse.ArgumentParser, length: int) -> None:
    p.add_argument("--length", type=int, default=length)
    p.add_argument("--depth", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=None, help="default: the sweep's seed for this length and depth")
    p.add_argument("--model", default=None)
    p.add_argument("--model-cache-dir", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--prefill-chunk-size", type=int, default=32768)
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--output", default=None)


def load_probe(args: argparse.Namespace, method: str, method_config: object) -> PasskeyProbe:
    llm = LLM(config=EngineConfig(model=args.model, model_cache_dir=args.model_cache_dir, method=method,
                                  device=args.device, max_context_tokens=args.length + 256, show_progress=False,
                                  prefill_chunk_size=args.prefill_chunk_size),
              method_config=method_config)
    tokenizer = llm.tokenizer
    seed = args.seed if args.seed is not None else args.length + int(round(args.depth * 100))  # run_eval's seed
    sample = make_passkey_sample(tokenizer, args.length, args.depth, seed)
    ids = llm.engine.encode_chat(sample.messages)
    has_digit = {t: any(ch.isdigit() for ch in tokenizer.decode([t])) for t in set(ids)}
    question_start = len(ids) - 40  # the question names "5-digit": its digit is not the needle's
    needle = [i for i, t in enumerate(ids[:question_start]) if has_digit[t]]
    return PasskeyProbe(llm, sample, seed, ids, needle)
