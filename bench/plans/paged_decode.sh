# The dense paged decode op alone, one Llama-3-8B layer (random K/V, bf16), one GPU (~4 minutes): its launch
# variants and rope-table dtypes at 32K and 128K for 1 and 8 sequences, against the K/V bytes at the copy bandwidth of
# the same run. Why: dense decode of the whole 8B-shaped model runs at ~55-59% of its bytes bound (results.md,
# "Serving throughput"); this says how much of that is the op and which launch reads fastest.
run paged_decode python3 -m bench paged-decode --contexts 32768 131072 --batch-sizes 1 8 --output $OUT_DIR/paged_decode.json
