# 2026-11-24, fourth session: issue 4's host-side decode profile and 1M speed after the host fixes, the 1M
# offloaded passkey's remaining depths, then issue 6's passkey sweeps (tokenselect, infinipot) 64K-1M x 5 depths.
O=bench/offload_decode_gpu.py
run host_256k python3 $O --warmup-steps 40 --contexts 262144 --steps 64 --preset 3k-flash --fast-prefill --host-profile --profile-rows 30
run host_1m_3k-flash python3 $O --warmup-steps 40 --contexts 1048576 --steps 64 --preset 3k-flash --kv-dtype fp8_e4m3 --fast-prefill --host-profile --profile-rows 30
wait_file /root/smol.gguf
S="python3 bench/passkey_sweep.py --model /root/smol.gguf --model-cache-dir /root/cache"
run passkey_offload_1m_b $S --method infinitehip --preset 3k --set "chunk_sizes=[256,32,16]" --lengths 1048576 --depths 0.7 0.9 --offload-enabled --mask-bank-tokens 36864 --attention-bank-tokens 131072 --output $OUT_DIR/passkey_offload_1m_b.json
run tokenselect_sweep $S --method tokenselect --lengths 65536 131072 262144 524288 1048576 --depths 0.1 0.3 0.5 0.7 0.9 --output $OUT_DIR/passkey_tokenselect.json
run infinipot_sweep $S --method infinipot --lengths 65536 131072 262144 524288 1048576 --depths 0.1 0.3 0.5 0.7 0.9 --output $OUT_DIR/passkey_infinipot.json
