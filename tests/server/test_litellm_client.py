"""litellm (a client nobody here wrote) maps our over-context error to its ContextWindowExceededError, which its
context-window fallbacks act on; an ordinary request goes through it unchanged."""

from __future__ import annotations

import pytest

from infinitehip.config.engine import EngineConfig
from infinitehip.config.server import ServerConfig
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.server.app import create_app
from tests.server.test_server import ServerThread

@pytest.fixture(scope="module")
def litellm():
    """Imported by the test that uses it, not at collection: every xdist worker collects every module, and the
    import takes seconds."""
    return pytest.importorskip("litellm")


def test_over_context_error_is_a_context_window_error_for_litellm(litellm):
    engine = LLMEngine(EngineConfig(max_context_tokens=512, kv_cache_tokens=4096, device="cpu", dtype="float32",
                                    show_progress=False))
    with ServerThread(create_app(engine, ServerConfig(served_model_name="smol"))) as url:
        kwargs = dict(model="openai/smol", api_base=f"{url}/v1", api_key="unused", max_tokens=4, temperature=0)
        ok = litellm.completion(messages=[{"role": "user", "content": "Say hi."}], **kwargs)
        assert ok.choices[0].message.content
        with pytest.raises(litellm.ContextWindowExceededError):
            litellm.completion(messages=[{"role": "user", "content": "hello " * 600}], **kwargs)
