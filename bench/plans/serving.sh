# `infinitehip serve` under load, Gemma 3 270M, one GPU (~10 minutes): 1, 4 and 16 streaming clients of ~4K-token
# prompts (dense: within the trained length), then 1 and 4 clients of ~128K-token prompts (auto past the trained
# length runs infinitehip) and the mixed-batch check: 4 streams decoding while a ~128K-token prompt is admitted (their
# longest gap against one step with a full prefill chunk). The server needs fastapi, starlette, pydantic(-core),
# annotated-types, typing-inspection and uvicorn, which the GPU image lacks: they travel in .whl (bench/README.md,
# "Detached on the GPU machine"), with opentelemetry-api, annotated-doc, anyio, click, h11 and idna (`pip download
# fastapi uvicorn` fetches them all). Prompts of ~N tokens: the suite counts words per token through the server's
# /tokenize.
# MODEL_DIR holds gemma.gguf (bench/device_models.py).
MODEL_DIR=${MODEL_DIR:-/root}
wait_file $MODEL_DIR/gemma_ready
run serve_4k python3 -m bench server-latency --concurrency 1 4 16 --requests-per-client 2 --prompt-tokens 4096 --max-tokens 128 --output $OUT_DIR/server_4k.json -- --model $MODEL_DIR/gemma.gguf --model-cache-dir $MODEL_DIR/cache --max-context-tokens 16384 --kv-cache-tokens 294912 --max-num-seqs 16
run serve_128k python3 -m bench server-latency --concurrency 1 4 --requests-per-client 1 --prompt-tokens 131072 --max-tokens 64 --admit-prompt-tokens 131072 --admit-streams 4 --admit-stream-tokens 512 --output $OUT_DIR/server_128k.json -- --model $MODEL_DIR/gemma.gguf --model-cache-dir $MODEL_DIR/cache --max-context-tokens 300000 --kv-cache-tokens 1600000 --max-num-seqs 8
