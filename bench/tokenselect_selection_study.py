"""What TokenSelect's decode selection holds on a passkey prompt, per layer: the share of the needle's digit
tokens selected, and the share of the selection taken by the single most selected token id (repeated filler).

The question behind it (issue 6): at 512K-1M the needle at depth 10% is not selected. The scoring is
position-free (keys without RoPE), and the filler is a cycle of five sentences, so its copies have near-identical
keys and votes; `--select-tokens` small enough for the budget / context ratio of 2,048 / 1M reproduces that
ratio at a length this CPU can run.

    python bench/tokenselect_selection_study.py --length 16384 --depth 0.1 --select-tokens 32 --device cpu

Vote ranks (first decode step of each layer): the rank of the needle's best digit token in the soft vote, and the
rank projected to `--project-length` tokens by scaling everything but the needle sentence: each head's softmax
normaliser Z_h = Z_needle + Z_rest becomes Z_needle + m * Z_rest and every non-needle key gets m copies
(m = project_length / length). This separates two regimes: at short contexts a retrieval head's softmax can be
dominated by the needle (its probability near 1, an easy win in the vote); at long ones every head's normaliser is
dominated by the filler and the needle must beat the filler's best tokens on exp(logit) / Z alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

import torch
from passkey_probe import add_probe_args, load_probe  # bench/ is the script's directory, first on sys.path

from infinitehip import SamplingParams
from infinitehip.attention.tokenselect.method import TokenSelectAttention
from infinitehip.config.tokenselect import TokenSelectConfig
from infinitehip.kv.paged_cache import token_slots
from infinitehip.model.rope import apply_rotary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_probe_args(p, length=16384)
    p.add_argument("--select-tokens", type=int, default=2048)
    p.add_argument("--vote-pool-size", type=int, default=TokenSelectConfig.vote_pool_size)
    p.add_argument("--selection-cache", action="store_true", help="default off: every decode step selects")
    p.add_argument("--project-length", type=int, default=1 << 20, help="length the vote ranks are projected to")
    args = p.parse_args()

    config = TokenSelectConfig(select_tokens=args.select_tokens, selection_cache=args.selection_cache,
                               vote_pool_size=args.vote_pool_size)
    probe = load_probe(args, "tokenselect", config)
    llm, sample, seed, ids, needle = probe.llm, probe.sample, probe.seed, probe.ids, set(probe.needle)

    needle_lo, needle_hi = min(needle) - 16, max(needle) + 16  # the needle sentence, roughly
    records: list[tuple[int, list[int]]] = []  # (layer, selected tokens) per decode selection
    ranks: dict[int, dict] = {}  # layer -> vote rank of the needle at the first decode selection

    def vote_ranks(self, q, k_flat, page_tables, page_size, limits, rope) -> dict:
        """Soft vote of one decode query over [sink, limit), recomputed in fp32 (as reference.soft_vote)."""
        c, H = self.config, q.shape[1]
        tokens = torch.arange(c.sink_tokens, limits[0], device=q.device)
        keys = k_flat[token_slots(page_tables[0], tokens, page_size)].float()  # [n, Hkv, d]
        rope.ensure(c.local_tokens + 1)
        q_rot = apply_rotary(q.float(), rope.cos[c.local_tokens], rope.sin[c.local_tokens])[0]  # [H, d]
        keys = keys.repeat_interleave(H // keys.shape[1], dim=1)  # [n, H, d]: query head h reads kv head h // g
        logits = torch.einsum("hd,nhd->hn", q_rot, keys) * self.sm_scale  # [H, n]
        region = (tokens >= needle_lo) & (tokens <= needle_hi)
        digits = torch.tensor(sorted(needle), device=q.device) - c.sink_tokens
        shift = logits.max(dim=1, keepdim=True).values
        w = (logits - shift).exp()  # [H, n]
        z_needle, z_rest = w[:, region].sum(1), w[:, ~region].sum(1)  # [H]
        out = {}
        for name, m in (("actual", 1.0), ("projected", args.project_length / len(ids))):
            votes = (w / (z_needle + m * z_rest)[:, None]).sum(0)  # [n]
            best = votes[digits].max()
            out[name] = int(round(m * int((votes[~region] > best).sum()))) + int((votes[region] > best).sum())
        out["needle_share_of_z"] = float((z_needle / (z_needle + z_rest)).max())  # best head
        return out
    decode, select = TokenSelectAttention.decode, TokenSelectAttention.select

    def decode_spy(self, layer, q, seqs, batch):
        self.study_layer = layer
        return decode(self, layer, q, seqs, batch)

    def select_spy(self, q, *rest):
        picked = select(self, q, *rest)
        if getattr(self, "study_layer", None) is not None and q.shape[0] == 1:
            records.append((self.study_layer, picked[0].tolist()))
            if self.study_layer not in ranks:
                ranks[self.study_layer] = vote_ranks(self, q, *rest)
        return picked

    TokenSelectAttention.decode, TokenSelectAttention.select = decode_spy, select_spy
    original_prefill = TokenSelectAttention.prefill

    def prefill_spy(self, layer, q, seq, batch):
        self.study_layer = None  # prefill selections are per query block: not recorded
        return original_prefill(self, layer, q, seq, batch)

    TokenSelectAttention.prefill = prefill_spy
    (out,) = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=args.max_tokens))

    per_layer = collections.defaultdict(list)
    for layer, picked in records:
        tops = collections.Counter(ids[t] for t in picked).most_common(1)
        per_layer[layer].append((len(needle & set(picked)) / max(1, len(needle)), tops[0][1] / len(picked)))
    rows = [dict(layer=layer, needle_selected=statistics.fmean(v[0] for v in vals),
                 top_token_share=statistics.fmean(v[1] for v in vals), **ranks.get(layer, {}))
            for layer, vals in sorted(per_layer.items())]
    print(f"length {len(ids)}, depth {args.depth}, seed {seed}, select_tokens {args.select_tokens}, "
          f"needle digit tokens {len(needle)}, answer {sample.answer!r}, output {out.text!r}")
    print(f"| layer | needle digits selected | selection taken by its most frequent token id | needle vote rank "
          f"| rank projected to {args.project_length} | needle share of Z (best head) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['layer']} | {r['needle_selected']:.2f} | {r['top_token_share']:.2f} | {r.get('actual')} "
              f"| {r.get('projected')} | {r.get('needle_share_of_z', float('nan')):.3f} |")
    mean_needle = statistics.fmean(r["needle_selected"] for r in rows)
    mean_top = statistics.fmean(r["top_token_share"] for r in rows)
    print(f"mean over layers: needle digits selected {mean_needle:.2f}, top token id share {mean_top:.2f}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(dict(length=len(ids), depth=args.depth, seed=seed, select_tokens=args.select_tokens,
                           project_length=args.project_length,
                           answer=sample.answer, output=out.text, correct=sample.is_correct(out.text),
                           layers=rows), f, indent=1)


if __name__ == "__main__":
    main()
