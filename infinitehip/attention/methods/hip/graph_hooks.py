"""HiP's CUDA-graph decode hooks (attention/capabilities.GraphDecode): which graph a decode step replays and the
host counters a replay advances by hand. A mixin of `HiPAttention` (it provides config, model_config and
refreshes_now); the decode step itself is `HiPAttention.decode`.

A step's key is (refreshes, selects): whether its layers recompute their selection now (every refresh_interval
steps) and whether the kept selection selects (a context too short for the candidates attends every key). The
rest of the step's shapes follow the capacity bucket and the config. Sequences of any keys share one graph: its
capture runs each one's own refresh.
"""

from __future__ import annotations

from infinitehip.attention.base import SequenceSlice
from infinitehip.attention.capabilities import GraphDecode
from infinitehip.attention.methods.hip.config import candidate_end
from infinitehip.attention.methods.hip.state import HiPState

BATCH_CLASS = ("hip",)


class HiPGraphHooks(GraphDecode):
    def graph_capturable(self) -> bool:
        """The reference selection walks the hierarchy on the host, and the reference op reads counts back."""
        return self.config.impl != "reference"

    def _sparse_layers(self) -> range:
        return range(min(self.config.dense_layers, self.model_config.num_layers), self.model_config.num_layers)

    def graph_key(self, seq: SequenceSlice) -> tuple | None:
        state: HiPState = seq.state
        layers = self._sparse_layers()
        if not self.graph_capturable() or (state.starts is None and len(layers) > 0):
            return None  # the first decode step allocates the kept selections: it runs eagerly
        if not layers:  # every layer dense: resident paged decode, no host state
            return False, False
        if state.position is None or seq.start_pos != state.position + 1:
            return None  # not the next token: the kept window would be wider than a graph's (eager reads it)
        steps = [state.decode_steps[layer] for layer in layers]
        if steps.count(steps[0]) != len(steps):  # a step stopped midway: a graph runs every layer's step
            return None
        refresh = self.refreshes_now(state, layers[0])
        return refresh, self.config.selects(seq.start_pos) if refresh else state.sparse[layers[0]]

    def graph_batch_class(self, method_key: tuple) -> tuple:
        return BATCH_CLASS

    def host_counters(self, state: HiPState) -> tuple:
        return state.counters()

    def set_host_counters(self, state: HiPState, counters: tuple) -> None:
        state.set_counters(counters)

    def advance_host_counters(self, state: HiPState, key: tuple) -> None:
        layers = self._sparse_layers()
        if not layers:
            return
        refresh, sparse = key
        position = state.position + 1
        for layer in layers:  # what decode's Python does for each layer
            if refresh:
                state.ends[layer] = candidate_end(position, self.config)
                state.sparse[layer] = sparse
                state.refreshes[layer] += 1
            state.decode_steps[layer] += 1
        state.position = position
