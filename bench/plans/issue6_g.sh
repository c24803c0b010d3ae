# 2026-11-25: TokenSelect's depth-10% misses at 512K / 1M, per layer: is the needle in the decode selection,
# and where does its best digit rank in the soft vote (bench/tokenselect_selection_study.py)? 128K depth 10%
# answers correctly in the sweep: the contrast.
wait_file /root/smol.gguf
S="python3 bench/tokenselect_selection_study.py --model /root/smol.gguf --model-cache-dir /root/cache --device cuda --depth 0.1 --max-tokens 12"
run study_1m $S --length 1048576 --output $OUT_DIR/ts_study_1m_d10.json
run study_512k $S --length 524288 --output $OUT_DIR/ts_study_512k_d10.json
run study_128k $S --length 131072 --output $OUT_DIR/ts_study_128k_d10.json
run study_1m_cache $S --length 1048576 --selection-cache --output $OUT_DIR/ts_study_1m_d10_cache.json
