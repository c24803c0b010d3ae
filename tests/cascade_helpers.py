"""The Cascading KV Cache's acceptance rule on plain Python lists, independent of attention/methods/cascade/schedule.py:
what the schedule's tests and the method's tests expect the cache to hold."""

from __future__ import annotations


def slots_receiving_a_token(sinks: int, subcaches: int, width: int, pushes: int) -> list[dict[int, int]]:
    """The paper's rule on plain lists, slot by slot -> per push (of tokens 0..pushes-1), {kept slot: its token}
    for the slots that hold one then (the sinks' token -1: older than every pushed one). Sub-cache i's slots are S + i W .. S + (i + 1) W - 1, a circular buffer; token t enters
    sub-cache 0; a sub-cache not full takes it in its first empty slot; a full one takes it when 2^i divides t,
    in its oldest slot, whose token moves on to sub-cache i + 1; otherwise (dropped, or replacing the newest) no
    slot gains a token and nothing moves on. Tokens are never scored here: which slots hold one does not depend
    on the scores, and their order by age does not either (a replaced newest stays the newest)."""
    token_in = [[None] * width for _ in range(subcaches)]  # sub-cache i, slot j -> token (None: never written)
    oldest_first = [[] for _ in range(subcaches)]  # the written slots of each sub-cache, oldest token first
    out = []
    for t in range(pushes):
        carry = t
        for i in range(subcaches):
            if len(oldest_first[i]) < width:
                j = token_in[i].index(None)
                token_in[i][j] = carry
                oldest_first[i].append(j)
                break
            if t % 2**i:
                break
            j = oldest_first[i].pop(0)
            carry, token_in[i][j] = token_in[i][j], carry
            oldest_first[i].append(j)
        held = {s: -1 for s in range(sinks)}  # sinks: older than every pushed token
        held |= {sinks + i * width + j: tok for i in range(subcaches) for j, tok in enumerate(token_in[i])
                 if tok is not None}
        out.append(held)
    return out

