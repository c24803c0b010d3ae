"""`auto`'s presets: InfiniteHiP's, with contexts within the trained length attended exactly.

Beyond the trained length `auto` runs the method the real-text suite measures best there on its tuning genres:
InfiniteHiP's default (docs/real-text.md, "Which method `auto` runs"). Each InfiniteHiP preset is available under
its own name, so `--method auto --preset paper-3k` is the paper's setting beyond the trained length.
"""

from __future__ import annotations

import dataclasses

from infinitehip.attention.methods.infinitehip.config import PRESETS as INFINITEHIP_PRESETS
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig

PRESETS: dict[str, InfiniteHiPConfig] = {
    name: dataclasses.replace(config, dense_within_trained=True) for name, config in INFINITEHIP_PRESETS.items()
}
