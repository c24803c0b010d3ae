"""LangChain's ChatOpenAI (a client nobody here wrote) against our server: `with_structured_output(Schema)` (its
default method, json_schema, sends response_format) returns a valid object; its tool-calling method gets a clear
400 (this server has no tool calls)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from infinitehip.config.engine import EngineConfig
from infinitehip.config.server import ServerConfig
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.server.app import create_app
from tests.server.test_server import ServerThread

@pytest.fixture(scope="module")
def langchain_openai():
    """Imported by the test that uses it, not at collection: every xdist worker collects every module, and the
    import takes seconds."""
    return pytest.importorskip("langchain_openai")


class City(BaseModel):
    city: str
    population: int


def test_with_structured_output_returns_a_valid_object(langchain_openai):
    import openai

    engine = LLMEngine(EngineConfig(max_context_tokens=1024, kv_cache_tokens=8192, device="cpu", dtype="float32",
                                    show_progress=False))
    with ServerThread(create_app(engine, ServerConfig(served_model_name="smol"))) as url:
        llm = langchain_openai.ChatOpenAI(model="smol", base_url=f"{url}/v1", api_key="unused", temperature=0,
                                          max_tokens=64, max_retries=0)
        city = llm.with_structured_output(City).invoke("Name a large city and its population.")
        assert isinstance(city, City) and city.city and city.population >= 0
        with pytest.raises(openai.BadRequestError, match="tools"):
            llm.with_structured_output(City, method="function_calling").invoke("Name a city.")
