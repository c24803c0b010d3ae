# 2026-11-24, third session (was bench/offload_long_gpu.sh): issue 4's long runs on the 8B-shaped random model.
# 1. 256K 3k-flash with the real prefill (phase times) and with --fast-prefill: the decode steps must match,
#    which is what licenses --fast-prefill for decode timing at 1M and 2M;
# 2. 1M FP8 store per preset (3k-flash with a decode profile after the timed steps, 3k, 3k-fast);
# 3. 2M FP8 store, 3k-flash: the planner spills the store layers the host cannot hold to GPU memory.
# The 40-step warm-up here is shorter than 3k-flash's longest refresh interval (96): a graph capture falls in the
# timed steps (found in the fourth session; the bench's default warm-up now covers it).
O="python3 bench/offload_decode_gpu.py --warmup-steps 40"
run offload_8b_256k_real $O --contexts 262144 --steps 64 --preset 3k-flash --phase-times
run offload_8b_256k_fast $O --contexts 262144 --steps 64 --preset 3k-flash --fast-prefill
run offload_8b_1m_fp8_3k-flash $O --contexts 1048576 --steps 88 --profile-steps 24 --preset 3k-flash --kv-dtype fp8_e4m3 --fast-prefill
run offload_8b_2m_fp8_3k-flash $O --contexts 2097152 --steps 64 --preset 3k-flash --kv-dtype fp8_e4m3 --fast-prefill --mask-bank-tokens 131072
run offload_8b_1m_fp8_3k $O --contexts 1048576 --steps 64 --preset 3k --kv-dtype fp8_e4m3 --fast-prefill
run offload_8b_1m_fp8_3k-fast $O --contexts 1048576 --steps 64 --preset 3k-fast --kv-dtype fp8_e4m3 --fast-prefill
