"""The page at / in a real headless browser (Debian's chromium and chromedriver, driven by selenium) against
`infinitehip serve` on the embedded model, started as a subprocess with an API key: the key asked once (a wrong
one shows the API's 401), a ~6K-token document with a pass key loaded from a file, its token count against the
limit, a question with prefill progress and the streamed answer, a follow-up served from the prefix cache, and an
over-long document answered with the server's context-length error. Each message shown is compared with what the
API itself answers to the same request.

Marked slow: the one 6K-token prefill on a 2-core CPU takes about a minute, so `make test` leaves it out and
.ci/run runs it after the suite. It writes the screenshots in docs/ui/.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from infinitehip.eval.passkey import FILLER_SENTENCES, NEEDLE_TEMPLATE, QUESTION, TASK, passkey_for_seed
from tests.server.serve_process import start_serve, wait_healthy

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("needs Debian's chromium and chromedriver (apt-get install chromium chromium-driver; .ci/run does)",
                allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the test extra)")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

KEY = "browser-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PASSKEY = passkey_for_seed(0)
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "ui"
PREFILL_CHUNK = 1024  # a 6K prompt in 6 chunks: 6 progress events
LIMIT = 8192  # the embedded SmolLM2's trained length
# Closed network: nothing of the browser's own reaches out (updates, sync, QUIC probes).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,1000")


def passkey_document(sentences: int) -> str:
    """The passkey task's text (eval/passkey.py: its filler, the needle half-way) without its question."""
    filler = [FILLER_SENTENCES[i % len(FILLER_SENTENCES)] for i in range(sentences)]
    filler.insert(sentences // 2, NEEDLE_TEMPLATE.format(key=PASSKEY))
    return f"{TASK}\n\n{' '.join(filler)}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    # The default method (auto); the context limit set to the model's trained length (auto's own default reaches
    # past it), so the over-long document stays cheap to build and count.
    flags = ("--api-key", KEY, "--prefill-chunk-size", str(PREFILL_CHUNK), "--max-context-tokens", str(LIMIT),
             "--show-progress", "false", "--log-level", "warning")
    with open(log, "w") as out:
        proc, url = start_serve(*flags, log=out)
    try:
        wait_healthy(proc, url, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


def wait(driver, condition, timeout: float = 60):
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: condition(d))


def visible(driver, element_id: str) -> bool:
    return driver.find_element(By.ID, element_id).is_displayed()


def open_page(driver, url: str) -> None:
    """The page, past the key form (entering the key if this tab's session has none yet); kept as it is when open."""
    if driver.current_url == f"{url}/" and visible(driver, "main"):
        return
    driver.get(f"{url}/")
    wait(driver, lambda d: visible(d, "main") or visible(d, "key-form"))
    if visible(driver, "key-form"):
        driver.find_element(By.ID, "api-key").send_keys(KEY + "\n")
        wait(driver, lambda d: visible(d, "main"))


def api_error(res: httpx.Response) -> str:
    """An error response as the page words it (its apiError): the API's own message."""
    err = res.json()["error"]
    code = f" ({err['code']})" if err.get("code") else ""
    return f"HTTP {res.status_code}{code}: {err['message']}"


def ask(driver, question: str) -> int:
    """Type a question and press Enter; returns the index of its turn on the page."""
    index = len(driver.find_elements(By.CSS_SELECTOR, "#turns .turn"))
    driver.find_element(By.ID, "question").send_keys(question + "\n")
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#turns .turn")) > index, 10)
    return index


def turn(driver, index: int):
    return driver.find_elements(By.CSS_SELECTOR, "#turns .turn")[index]


def wait_done(driver, index: int, timeout: float):
    wait(driver, lambda d: turn(d, index).get_attribute("data-done") == "true", timeout)
    return turn(driver, index)


def test_api_key_asked_once_and_a_wrong_key_shows_401(server, browser):
    browser.get(f"{server}/")
    wait(browser, lambda d: visible(d, "key-form"))
    assert not visible(browser, "main")
    browser.find_element(By.ID, "api-key").send_keys("wrong-key\n")
    wait(browser, lambda d: visible(d, "key-error"))
    wrong = httpx.get(f"{server}/server_info", headers={"Authorization": "Bearer wrong-key"})
    assert wrong.status_code == 401
    assert browser.find_element(By.ID, "key-error").text == api_error(wrong)
    assert not visible(browser, "main")

    browser.find_element(By.ID, "api-key").send_keys(KEY + "\n")
    wait(browser, lambda d: visible(d, "main"))
    info = httpx.get(f"{server}/server_info", headers=AUTH).json()
    shown = {dd.get_attribute("data-setting"): dd.text
             for dd in browser.find_elements(By.CSS_SELECTOR, "#settings-list dd")}
    assert shown["model"] == info["model"] and shown["method"] == info["method"] == "auto"  # the default
    assert shown["context limit"] == f"{info['max_model_len']:,} tokens"
    assert shown["prefix caching"] == "on"
    assert shown["sampling defaults"].startswith(f"temperature {info['sampling_defaults']['temperature']:g}, top_p")
    # Kept for this tab's session only, and asked once: a reload goes straight to the page.
    assert browser.execute_script("return sessionStorage.getItem('infinitehip.apiKey')") == KEY
    assert browser.execute_script("return localStorage.length") == 0
    browser.refresh()
    wait(browser, lambda d: visible(d, "main"))
    assert not visible(browser, "key-form")


def test_document_question_progress_answer_and_cached_follow_up(server, browser, tmp_path):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    document = passkey_document(1200)
    doc_file = tmp_path / "passkey.txt"
    doc_file.write_text(document)
    open_page(browser, server)
    browser.find_element(By.ID, "file").send_keys(str(doc_file))
    count = browser.find_element(By.ID, "token-count")
    wait(browser, lambda d: count.get_attribute("data-tokens") is not None, 30)
    assert browser.find_element(By.ID, "document").get_attribute("value") == document
    expected = httpx.post(f"{server}/tokenize", headers=AUTH,
                          json={"messages": [{"role": "user", "content": document}]}).json()["count"]
    assert 5500 <= expected <= 6500
    assert int(count.get_attribute("data-tokens")) == expected
    assert count.text.startswith(f"{expected:,} tokens of the server's limit of 8,192")
    temperature = browser.find_element(By.ID, "temperature")  # greedy: the answer is the model's most likely one
    temperature.clear()
    temperature.send_keys("0")

    first = ask(browser, QUESTION)
    progress_text = re.compile(r"prefill ([\d,]+) / ([\d,]+) tokens · [\d,]+ tokens/s · about [\d.]+ s left")

    def mid_prefill(d) -> bool:
        m = progress_text.fullmatch(turn(d, first).find_element(By.CLASS_NAME, "progress-text").text)
        return m is not None and m[1] != m[2]

    wait(browser, mid_prefill, 300)
    browser.save_screenshot(str(SCREENSHOTS / "progress.png"))
    done = wait_done(browser, first, 600)
    assert done.find_element(By.CLASS_NAME, "error").text == ""
    prompt_tokens = httpx.post(f"{server}/tokenize", headers=AUTH, json={
        "messages": [{"role": "user", "content": f"{document}\n\n{QUESTION}"}]}).json()["count"]
    events = int(done.get_attribute("data-progress-events"))
    assert events == -(-prompt_tokens // PREFILL_CHUNK)  # one a chunk, each shown
    assert done.find_element(By.CLASS_NAME, "progress-text").text.startswith(
        f"prefill {prompt_tokens:,} / {prompt_tokens:,} tokens")
    answer = done.find_element(By.CLASS_NAME, "answer").text
    assert PASSKEY in answer  # the embedded model finds this needle greedily at this length (dense)
    assert (done.get_attribute("data-prompt-tokens"), done.get_attribute("data-cached-tokens")) == (
        str(prompt_tokens), "0")
    stats = done.find_element(By.CLASS_NAME, "stats").text
    assert re.fullmatch(rf"first token after [\d.]+ s · 0 of {prompt_tokens:,} prompt tokens from the cache · "
                        r"\d+ tokens generated", stats), stats
    browser.save_screenshot(str(SCREENSHOTS / "first-question.png"))

    follow_up = ask(browser, "Repeat the pass key.")
    done = wait_done(browser, follow_up, 300)
    assert done.find_element(By.CLASS_NAME, "error").text == ""
    assert done.find_element(By.CLASS_NAME, "answer").text
    cached = int(done.get_attribute("data-cached-tokens"))
    assert prompt_tokens // 2 < cached < int(done.get_attribute("data-prompt-tokens"))  # the document's pages
    assert f"{cached:,} of" in done.find_element(By.CLASS_NAME, "stats").text
    assert re.fullmatch(rf"prefill ([\d,]+) / \1 tokens · [\d,]+ computed at [\d,]+ tokens/s, {cached:,} from the cache",
                        done.find_element(By.CLASS_NAME, "progress-text").text)
    browser.save_screenshot(str(SCREENSHOTS / "follow-up.png"))


def test_over_long_document_shows_the_context_length_error(server, browser):
    open_page(browser, server)
    document = passkey_document(2000)
    area = browser.find_element(By.ID, "document")
    browser.execute_script(  # pasted: the textarea's input event, as a paste fires it
        "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'));", area, document)
    count = browser.find_element(By.ID, "token-count")
    wait(browser, lambda d: "over" in count.get_attribute("class").split(), 30)
    assert "longer than the server's limit of 8,192 tokens" in count.text
    assert not browser.find_elements(By.CSS_SELECTOR, "#turns .turn")  # a new document: a new conversation

    index = ask(browser, QUESTION)
    done = wait_done(browser, index, 60)
    refused = httpx.post(f"{server}/v1/chat/completions", headers=AUTH, json={
        "messages": [{"role": "user", "content": f"{document}\n\n{QUESTION}"}], "stream": True, "max_tokens": 256,
        "temperature": 0})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    assert done.find_element(By.CLASS_NAME, "error").text == api_error(refused)
    assert "maximum context length is 8192 tokens" in done.find_element(By.CLASS_NAME, "error").text
    assert done.find_element(By.CLASS_NAME, "answer").text == ""
