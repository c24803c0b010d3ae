"""The page's routes without a browser: its files at / and /ui/ (open without the API key, and only those), the
`ui` switch (`--ui false`), and GET /server_info against the engine it describes. The page itself runs in a real
browser in test_ui_browser.py."""

from __future__ import annotations

import dataclasses
from html.parser import HTMLParser

import httpx
import pytest

from infinitehip.attention.methods.infinitehip.config import infinitehip_preset
from infinitehip.cli.main import build_parser
from infinitehip.cli.serve import configs_from_args
from infinitehip.config.server import ServerConfig
from infinitehip.server.app import create_app
from infinitehip.server.ui_routes import UI_DIR
from tests.conftest import engine_for_dir
from tests.server.test_server import ServerThread

KEY = "ui-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def engine(tiny_llama_dir, tokenizer):
    return engine_for_dir(tiny_llama_dir, tokenizer, method="infinitehip", method_config=infinitehip_preset("3k-fast"),
                          max_context_tokens=4096, kv_cache_tokens=4096, use_generation_config=False)


class _References(HTMLParser):
    """The src / href of the page's script and stylesheet tags."""

    def __init__(self):
        super().__init__()
        self.urls = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "link") and (attrs.get("src") or attrs.get("href")):
            self.urls.append(attrs.get("src") or attrs.get("href"))


def test_page_is_served_without_the_key_and_server_info_needs_it(engine):
    with ServerThread(create_app(engine, ServerConfig(api_key=KEY))) as url:
        page = httpx.get(f"{url}/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.text == (UI_DIR / "index.html").read_text()
        assert "default-src 'self'" in page.headers["content-security-policy"]
        refs = _References()
        refs.feed(page.text)
        assert sorted(refs.urls) == ["/ui/app.js", "/ui/style.css"]  # its own files only: nothing from elsewhere
        for ref in refs.urls:
            res = httpx.get(f"{url}{ref}")
            assert res.status_code == 200 and res.text == (UI_DIR / ref.removeprefix("/ui/")).read_text()
        # Only the page's files are open: other paths under /ui/ and the API still need the key.
        assert httpx.get(f"{url}/ui/index.html").status_code == 401
        assert httpx.get(f"{url}/server_info").status_code == 401
        assert httpx.post(f"{url}/tokenize", json={"prompt": "hi"}).status_code == 401
        assert httpx.get(f"{url}/ui/missing.js", headers=AUTH).status_code == 404

        info = httpx.get(f"{url}/server_info", headers=AUTH).json()
        model = httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]
    assert (info["model"], info["max_model_len"], info["method"], info["preset"]) == (
        model["id"], model["max_model_len"], model["method"], model["preset"])
    assert (info["method"], info["preset"], info["max_model_len"]) == ("infinitehip", "3k-fast", 4096)
    expected = dataclasses.asdict(infinitehip_preset("3k-fast"))
    assert info["method_config"] == {k: list(v) if isinstance(v, tuple) else v for k, v in expected.items()}
    assert info["prefix_caching"] is (engine.prefix is not None)
    assert info["prefill_chunk_size"] == engine.resolved.prefill_chunk_size
    # no generation_config.json defaults here: SamplingParams' own
    assert info["sampling_defaults"] == {"temperature": 1.0, "top_p": 1.0, "top_k": None, "min_p": 0.0,
                                         "repetition_penalty": 1.0}


def test_ui_false_turns_the_page_off_and_keeps_the_api(engine):
    args = build_parser().parse_args(["serve", "--ui", "false"])
    config = configs_from_args(args)[1]
    assert config.ui is False and ServerConfig().ui is True
    with pytest.raises(ValueError, match="ui must be true or false"):
        ServerConfig(ui="no")
    with ServerThread(create_app(engine, config)) as url:
        for path in ("/", "/ui/app.js", "/ui/style.css"):
            res = httpx.get(f"{url}{path}")
            assert res.status_code == 404 and res.json()["error"]["code"] == "not_found"
        assert httpx.get(f"{url}/server_info").json()["method"] == "infinitehip"
