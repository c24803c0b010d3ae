# 2026-11-24, fourth session: offloaded prefill at 128K (8B shape, random weights, real prefill, phase times) with
# the prefill's representative requests compacted, and as before (--resolve-every-copy), same process order.
O="python3 bench/offload_decode_gpu.py --contexts 131072 --preset 3k-flash --steps 8 --warmup-steps 2 --phase-times"
run prefill_128k_compact $O
run prefill_128k_every_copy $O --resolve-every-copy
