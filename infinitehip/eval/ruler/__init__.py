"""RULER-style synthetic retrieval tasks (Hsieh et al., 2024) over real-prose haystacks.

haystacks: the corpora; needles: keys, values, sentences; tasks: sample builders and scoring;
positions: needle token positions for the engine's needle probe; runner: the sweep (JSON, resume,
tables); plots: heatmaps; report: markdown tables from result files.
"""

from .haystacks import HAYSTACKS, get_haystack
from .positions import needle_token_positions
from .tasks import TASKS, RulerSample, make_ruler_sample

__all__ = ["HAYSTACKS", "TASKS", "RulerSample", "get_haystack", "make_ruler_sample", "needle_token_positions"]
