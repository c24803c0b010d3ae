"""`auto`'s presets: InfiniteHiP's, with contexts up to half the trained length attended exactly.

Beyond half the trained length `auto` runs the method the real-text suite measures best there on its tuning
genres: InfiniteHiP's default, which also reads the needles dense loses near the trained length's end
(docs/real-text.md, "Which method `auto` runs"). Each InfiniteHiP preset is available under
its own name, so `--method auto --preset paper-3k` is the paper's setting beyond half the trained length.
"""

from __future__ import annotations

import dataclasses

from infinitehip.attention.methods.infinitehip.config import PRESETS as INFINITEHIP_PRESETS
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig

AUTO_DENSE_SHARE = 0.5  # of the trained length: dense reads the suite there; pruning reads it better from there on

PRESETS: dict[str, InfiniteHiPConfig] = {
    name: dataclasses.replace(config, dense_within_trained=True, dense_within_share=AUTO_DENSE_SHARE)
    for name, config in INFINITEHIP_PRESETS.items()
}
