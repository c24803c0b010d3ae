# The sparse decode op alone (attention/ops/sparse/, what infinitehip, tokenselect and hip decode through), one
# Llama-3-8B layer (random K/V, bf16), one GPU (~4 minutes): its launch variants, the fused split merge (the last split
# merges: no merge kernel) and rope-table dtypes over ~3K listed keys of 32K and 128K contexts (a default decode's
# lists), for 1 and 8 sequences, against the K/V bytes at the copy bandwidth of the same run; then the dense paged
# decode's default launch beside its fused merge. Why: at 8 sequences the sparse decode is the batched step's largest
# share after the weights, and at one sequence the merge kernel is a launch of its own (results.md, "Serving
# throughput", the op tables).
run sparse_decode python3 -m bench paged-decode --op sparse --keys 3072 --contexts 32768 131072 --batch-sizes 1 8 --launches default fused 32:4:2 32:4:2:fused 64:4:2:fused 64:8:2 --splits 12 24 --output $OUT_DIR/sparse_decode.json
run paged_fused python3 -m bench paged-decode --contexts 32768 131072 --batch-sizes 1 8 --tables fp16 --launches default fused 32:2:3:fused 64:4:3:fused --output $OUT_DIR/paged_decode_fused.json
