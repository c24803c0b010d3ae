"""The cascade on the embedded model (SmolLM2-135M, CPU): a pass key beyond its cache that streaming loses.

What keeps it (bench/cascade_trace.py traces a prompt): past the filling, sub-cache i holds one token of each block
of 2^i tokens (test_cascade_update.py), so a key tokenized digit by digit survives whole in sub-cache 0 only, and
the model still reads it at sub-cache 1's half density (each head keeps its own half); the earliest W tokens after
the sinks, which fill every sub-cache in turn (the paper's "cache is not full" case), stay a contiguous run in the
last one until 8W pushes after it filled. A key early in the prompt sits in that run; streaming's window with the
same attended slots holds only the prompt's end.
"""

from __future__ import annotations

import pytest
import torch

from infinitehip import LLM, EngineConfig, SamplingParams
from infinitehip.attention.methods.cascade.config import CascadeConfig
from infinitehip.attention.methods.streaming.config import StreamingConfig
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.eval.passkey import make_passkey_sample
from infinitehip.model.gguf_convert import default_cache_root
from infinitehip.model.loading import load_model


def _answer(loaded, method, config, sample):
    engine = LLMEngine(EngineConfig(device="cpu", dtype="float32", show_progress=False, method=method,
                                    method_config=config), loaded)
    (out,) = LLM.from_engine(engine).chat(sample.messages, SamplingParams(temperature=0.0, max_tokens=12))
    return out.text


@pytest.mark.slow  # two real-model retrievals of a 2K prompt (tens of seconds of CPU): make test-slow
def test_embedded_model_reads_a_passkey_past_the_cascade_that_streaming_at_the_same_size_loses():
    """~2K-token prompt, key at 10%: cascade of 64 sinks + 4 x 224 + a 128-token stride (1,088 slots) against
    streaming attending 64 sinks + a 1,024-token window (the same 1,088 keys per query)."""
    loaded = load_model(None, default_cache_root(), torch.device("cpu"), torch.float32)
    sample = make_passkey_sample(loaded.tokenizer, 2048, 0.1, 2048 + 10)
    cascade = CascadeConfig(sink_tokens=64, cache_tokens=960, num_subcaches=4, stride_tokens=128)
    assert cascade.limit_tokens == 1088 < sample.prompt_tokens
    streaming = StreamingConfig(sink_tokens=64, window_tokens=1024)
    cascade_text = _answer(loaded, "cascade", cascade, sample)
    assert sample.is_correct(cascade_text), (sample.answer, cascade_text)
    streaming_text = _answer(loaded, "streaming", streaming, sample)
    assert not sample.is_correct(streaming_text), (sample.answer, streaming_text)
