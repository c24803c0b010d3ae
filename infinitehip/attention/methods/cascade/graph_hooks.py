"""The cascade's CUDA-graph decode hooks (attention/capabilities.GraphDecode). A mixin of `CascadeAttention` (it
provides config).

Every decode step launches the same work: each query attends its sequence's limit_tokens slots under a mask
(decode.py), whatever the position, the fill of the stride or of the sub-caches. What changes between steps lives
in device tensors: the step's positions and page tables (the graph's static inputs) and each sequence's
DecodeKeys and scores, which the push (after the step that fills the stride, eagerly, outside the graph: the
engine's after_forward) rewrites in place. So one key serves every step of every sequence, sequences of any
lengths share one graph, and no host counter is advanced by hand (the defaults).
"""

from __future__ import annotations

from infinitehip.attention.base import SequenceSlice
from infinitehip.attention.capabilities import GraphDecode

GRAPH_KEY = ("cascade",)


class CascadeGraphHooks(GraphDecode):
    def static_decode(self) -> bool:
        """Decode in static shapes (decode.py) unless impl is "reference", whose decode is the oracle's: each token
        as a one-token chunk over the listed keys (host-made lists of the step's length)."""
        return self.config.impl != "reference"

    def graph_key(self, seq: SequenceSlice) -> tuple | None:
        if seq.probe is not None or not self.static_decode():  # a probe records on the host: eager
            return None
        if seq.state.decode_keys is None:  # (allocated by the prompt's first chunk)
            return None
        return GRAPH_KEY

    def decode_rope_positions(self, capacity: int) -> int:
        # every slot is rotated, the masked ones too: positions below limit_tokens whatever the context
        return max(capacity, self.config.limit_tokens)
