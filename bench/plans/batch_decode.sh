# Serving throughput on one GPU (~5 minutes): several sequences decoding at once against one, dense and infinitehip,
# random Llama-3-8B-shaped bf16 weights (say so wherever reported), the bytes-read bound of the same run; then the
# dense single-sequence step the paged decode op replaced. Rows of docs/results.md. 128K and offloaded KV:
# plans/batch_decode_long.sh. METHODS and BATCH_SIZES pick a share (a share skips the dense single-sequence step).
# 100 warm-up steps: every refresh pattern's graph captured before the timed steps (the steady state).
run batch32k python3 -m bench batch-decode --model random8b --contexts 32768 --batch-sizes ${BATCH_SIZES:-1 4 8 16} --methods ${METHODS:-dense infinitehip} --warmup-steps 100 --steps 32 --output $OUT_DIR/batch_decode_32k.json
[ -n "${METHODS:-}" ] || run dense_decode python3 -m bench decode --contexts 32768 131072 --methods dense --steps 32 --warmup-steps 8 --output $OUT_DIR/decode_dense.json
run profile32k python3 -m bench batch-decode --model random8b --contexts 32768 --batch-sizes 8 --methods infinitehip --warmup-steps 100 --steps 16 --profile-steps 4 --output $OUT_DIR/batch_decode_32k_profile.json
# Where tokenselect's single-sequence step goes (its N = 1 step is ~3x infinitehip's at 32K: every key scored, then
# top-k and sorts over the context's width): four profiled steps (random weights; the Selection Cache never hits).
run profile_tokenselect python3 -m bench batch-decode --model random8b --contexts 32768 --batch-sizes 1 --methods tokenselect --warmup-steps 16 --steps 8 --profile-steps 4 --output $OUT_DIR/batch_decode_tokenselect_profile.json
