# The sparse decode op alone (attention/ops/sparse/, what infinitehip, tokenselect and hip decode through), one
# Llama-3-8B layer (random K/V, bf16), one GPU (~3 minutes): its launch variants and rope-table dtypes over ~3K listed
# keys of 32K and 128K contexts (a default decode's lists), for 1 and 8 sequences, against the K/V bytes at the copy
# bandwidth of the same run. Why: at 8 sequences it is the batched step's largest share after the weights
# (results.md, "Serving throughput").
run sparse_decode python3 -m bench paged-decode --op sparse --keys 3072 --contexts 32768 131072 --batch-sizes 1 8 --splits 4 8 12 24 32 --output $OUT_DIR/sparse_decode.json
