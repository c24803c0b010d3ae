"""InfiniteHiP attention: pruning stages, chunk scoring, dynamic RoPE positions, the method."""
