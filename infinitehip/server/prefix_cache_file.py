"""The server's prefix cache on disk (ServerConfig.prefix_cache_dir): loaded before the engine loop starts, saved
after it stopped. A file that fails its checks (engine/prefix_file_check.py) stops the start with one line naming
it, or, with on_bad_prefix_cache "skip", is moved aside (kept, never overwritten by the next save) and the server
starts with an empty cache."""

from __future__ import annotations

import logging
from pathlib import Path

from infinitehip.config.server import ServerConfig
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.engine.prefix_file_check import PrefixCacheFileError

logger = logging.getLogger("infinitehip.server")

PREFIX_CACHE_FILE = "prefix_cache.safetensors"  # in ServerConfig.prefix_cache_dir
REJECTED_SUFFIX = ".rejected"  # a skipped file, moved aside


class PrefixCacheFile:
    def __init__(self, engine: LLMEngine, config: ServerConfig):
        self.engine, self.on_bad = engine, config.on_bad_prefix_cache
        self.path = Path(config.prefix_cache_dir) / PREFIX_CACHE_FILE if config.prefix_cache_dir else None

    def load(self) -> int:
        """Pages loaded (0 without a file). ValueError naming the file when it is bad and on_bad is "refuse"."""
        if self.path is None or not self.path.exists():
            return 0
        try:
            return self.engine.load_prefix_cache(self.path)
        except PrefixCacheFileError as exc:
            if self.on_bad == "refuse":
                advice = "Move or delete it, or start with --on-bad-prefix-cache skip"
                raise PrefixCacheFileError(f"{exc}. {advice}") from None
            aside = self.path.with_name(self.path.name + REJECTED_SUFFIX)
            try:
                self.path.replace(aside)
            except OSError as move_error:
                logger.warning("%s; starting with an empty prefix cache, which will not be saved (could not move the "
                               "file aside: %s)", exc, move_error)
                self.path = None
            else:
                logger.warning("%s; moved to %s, starting with an empty prefix cache", exc, aside)
            return 0

    def save(self) -> None:
        """Write the cached prefixes (the engine loop has stopped: nothing else touches the KV)."""
        if self.path is not None and self.engine.prefix is not None:
            self.engine.save_prefix_cache(self.path)
