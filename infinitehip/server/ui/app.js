// The page at /: load a document, see its length against the server's limit, ask questions, watch the prefill.
// Plain browser JavaScript against the server's public API (no build step, nothing loaded from elsewhere).
"use strict";

const KEY_STORAGE = "infinitehip.apiKey"; // sessionStorage: gone when the tab closes
const $ = (id) => document.getElementById(id);
const fmt = (n) => Math.round(n).toLocaleString("en-US");

const state = {
  key: sessionStorage.getItem(KEY_STORAGE),
  info: null, // GET /server_info
  turns: [], // {question, answer} of the conversation so far (the document goes with the first question)
  countTimer: null,
  countSerial: 0,
  abort: null,
};

// ---- API ------------------------------------------------------------------------------------------------------
function api(path, body, signal) {
  const headers = { "Content-Type": "application/json" };
  if (state.key) headers.Authorization = "Bearer " + state.key;
  const options = body === undefined ? { headers } : { method: "POST", headers, body: JSON.stringify(body) };
  return fetch(path, { ...options, signal });
}

// An error response as the API words it: "HTTP 400 (context_length_exceeded): This model's maximum ...".
async function apiError(res) {
  const text = await res.text();
  try {
    const err = JSON.parse(text).error;
    if (err && err.message) return `HTTP ${res.status}${err.code ? ` (${err.code})` : ""}: ${err.message}`;
  } catch (_) { /* not JSON: shown as it came */ }
  return `HTTP ${res.status}: ${text || res.statusText}`;
}

function show(el, text) {
  el.textContent = text;
  el.hidden = !text;
}

// ---- connecting, the API key ----------------------------------------------------------------------------------
async function connect() {
  let res;
  try {
    res = await api("/server_info");
  } catch (e) {
    show($("connect-error"), `cannot reach the server: ${e.message}`);
    return;
  }
  if (res.status === 401) {
    const hadKey = Boolean(state.key);
    const message = await apiError(res);
    state.key = null;
    sessionStorage.removeItem(KEY_STORAGE);
    $("main").hidden = true;
    $("key-form").hidden = false;
    show($("key-error"), hadKey ? message : "");
    $("server-summary").textContent = "API key needed";
    $("api-key").focus();
    return;
  }
  if (!res.ok) {
    show($("connect-error"), await apiError(res));
    return;
  }
  state.info = await res.json();
  $("key-form").hidden = true;
  show($("key-error"), "");
  show($("connect-error"), "");
  $("main").hidden = false;
  renderSettings(state.info);
  countTokens();
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const key = $("api-key").value.trim();
  if (!key) return;
  state.key = key;
  sessionStorage.setItem(KEY_STORAGE, key);
  $("api-key").value = "";
  connect();
});

// ---- settings -------------------------------------------------------------------------------------------------
function renderSettings(info) {
  const sampling = info.sampling_defaults;
  $("server-summary").textContent =
    `${info.model} · method ${info.method}${info.preset ? ` (${info.preset})` : ""} · context ${fmt(info.max_model_len)} tokens`;
  const rows = [
    ["model", info.model],
    ["method", info.method],
    ["preset", info.preset || "none"],
    ["context limit", `${fmt(info.max_model_len)} tokens`],
    ["prefix caching", info.prefix_caching ? "on" : "off"],
    ["prefill chunk", `${fmt(info.prefill_chunk_size)} tokens`],
    ["sampling defaults", Object.entries(sampling).map(([k, v]) => `${k} ${v === null ? "off" : v}`).join(", ")],
  ];
  const list = $("settings-list");
  list.replaceChildren();
  for (const [name, value] of rows) {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = name;
    dd.textContent = value;
    dd.dataset.setting = name;
    list.append(dt, dd);
  }
  $("method-config").textContent = info.method_config ? JSON.stringify(info.method_config, null, 2) : "(none)";
  if ($("temperature").value === "") $("temperature").value = sampling.temperature;
}

// ---- the document ---------------------------------------------------------------------------------------------
function documentText() {
  return $("document").value;
}

function documentChanged() {
  if (state.turns.length) newConversation(); // the conversation was about the earlier text
  clearTimeout(state.countTimer);
  state.countTimer = setTimeout(countTokens, 300);
}

// The document's length in tokens through the chat template, as the first question sends it (POST /tokenize).
async function countTokens() {
  const el = $("token-count");
  const text = documentText();
  const serial = ++state.countSerial;
  el.classList.remove("over");
  if (!text) {
    el.textContent = "no document";
    delete el.dataset.tokens;
    return;
  }
  el.textContent = "counting tokens…";
  let res;
  try {
    res = await api("/tokenize", { messages: [{ role: "user", content: text }] });
  } catch (e) {
    el.textContent = `cannot count tokens: ${e.message}`;
    return;
  }
  if (serial !== state.countSerial) return; // the text changed meanwhile
  if (!res.ok) {
    el.textContent = await apiError(res);
    return;
  }
  const { count, max_model_len: limit } = await res.json();
  el.dataset.tokens = count;
  if (count >= limit) {
    el.classList.add("over");
    el.textContent = `${fmt(count)} tokens: longer than the server's limit of ${fmt(limit)} tokens`;
  } else {
    el.textContent = `${fmt(count)} tokens of the server's limit of ${fmt(limit)} (${((100 * count) / limit).toFixed(1)}%)`;
  }
}

$("document").addEventListener("input", () => {
  $("file-name").textContent = "";
  documentChanged();
});

$("file").addEventListener("change", async () => {
  const file = $("file").files[0];
  if (!file) return;
  if (file.type === "application/pdf" || /\.pdf$/i.test(file.name)) {
    $("file-name").textContent = `${file.name}: PDF is not read here; paste its text instead`;
    return;
  }
  $("document").value = await file.text();
  $("file-name").textContent = `${file.name} (${fmt(file.size)} bytes)`;
  documentChanged();
});

// ---- asking ---------------------------------------------------------------------------------------------------
function newConversation() {
  if (state.abort) state.abort.abort();
  state.turns = [];
  $("turns").replaceChildren();
}

$("new-button").addEventListener("click", newConversation);
$("stop-button").addEventListener("click", () => state.abort && state.abort.abort());

function messagesFor(question) {
  const messages = [];
  const doc = documentText();
  state.turns.forEach((turn, i) => {
    messages.push({ role: "user", content: i === 0 ? `${doc}\n\n${turn.question}` : turn.question });
    messages.push({ role: "assistant", content: turn.answer });
  });
  messages.push({ role: "user", content: state.turns.length ? question : `${doc}\n\n${question}` });
  return messages;
}

function turnElement(question) {
  const el = document.createElement("article");
  el.className = "turn";
  el.dataset.progressEvents = "0";
  const parts = {};
  for (const name of ["question", "progress", "answer", "stats", "error"]) {
    parts[name] = document.createElement(name === "progress" ? "div" : "p");
    parts[name].className = name;
    el.append(parts[name]);
  }
  parts.question.textContent = question;
  parts.bar = document.createElement("progress");
  parts.barText = document.createElement("span");
  parts.barText.className = "progress-text";
  parts.progress.append(parts.bar, parts.barText);
  parts.progress.hidden = true;
  parts.stats.hidden = true;
  parts.error.hidden = true;
  parts.error.classList.add("error");
  $("turns").append(el);
  el.scrollIntoView({ block: "end" });
  return { el, ...parts };
}

function requestBody(question) {
  const body = {
    messages: messagesFor(question),
    stream: true,
    stream_options: { include_usage: true },
    prefill_progress: true,
  };
  const temperature = $("temperature").value;
  const maxTokens = $("max-tokens").value;
  if (temperature !== "") body.temperature = Number(temperature);
  if (maxTokens !== "") body.max_tokens = Number(maxTokens);
  return body;
}

// Prefill progress with tokens/s and the time left. The first event's rate counts from the request's start, later
// ones' from the first event (whose count may hold prefix-cache hits, which took no prefill).
function showProgress(view, timing, progress) {
  const now = performance.now();
  let base = timing.progressBase;
  if (!base) {
    base = { t: timing.start, processed: 0 };
    timing.progressBase = { t: now, processed: progress.processed };
  }
  const seconds = (now - base.t) / 1000;
  const rate = seconds > 0 && progress.processed > base.processed ? (progress.processed - base.processed) / seconds : 0;
  const left = rate > 0 ? (progress.total - progress.processed) / rate : null;
  view.el.dataset.progressEvents = String(Number(view.el.dataset.progressEvents) + 1);
  view.progress.hidden = false;
  view.bar.max = progress.total;
  view.bar.value = progress.processed;
  view.barText.textContent = `prefill ${fmt(progress.processed)} / ${fmt(progress.total)} tokens` +
    (rate > 0 ? ` · ${fmt(rate)} tokens/s` : "") +
    (left !== null && progress.processed < progress.total ? ` · about ${left.toFixed(1)} s left` : "");
}

function showStats(view, timing, usage) {
  const cached = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
  view.el.dataset.cachedTokens = cached;
  view.el.dataset.promptTokens = usage.prompt_tokens;
  const ttft = timing.firstToken === null ? null : (timing.firstToken - timing.start) / 1000;
  if (!view.progress.hidden && ttft !== null) { // the prefill's summary, now that the cache hits are known
    const computed = usage.prompt_tokens - cached;
    view.barText.textContent = `prefill ${fmt(usage.prompt_tokens)} / ${fmt(usage.prompt_tokens)} tokens · ` +
      `${fmt(computed)} computed at ${fmt(computed / ttft)} tokens/s` + (cached ? `, ${fmt(cached)} from the cache` : "");
  }
  view.stats.hidden = false;
  view.stats.textContent =
    (ttft === null ? "no token generated" : `first token after ${ttft.toFixed(2)} s`) +
    ` · ${fmt(cached)} of ${fmt(usage.prompt_tokens)} prompt tokens from the cache` +
    ` · ${fmt(usage.completion_tokens)} tokens generated`;
}

// One server-sent event's data; returns false at [DONE] or after an error.
function handleEvent(data, view, timing, turn) {
  if (data === "[DONE]") return false;
  const chunk = JSON.parse(data);
  if (chunk.error) {
    show(view.error, `error: ${chunk.error.message}`);
    return false;
  }
  if (chunk.prefill_progress) showProgress(view, timing, chunk.prefill_progress);
  for (const choice of chunk.choices || []) {
    const text = choice.delta && choice.delta.content;
    if (text) {
      if (timing.firstToken === null) {
        timing.firstToken = performance.now();
        view.el.dataset.ttftMs = Math.round(timing.firstToken - timing.start);
      }
      turn.answer += text;
      view.answer.textContent = turn.answer;
    }
  }
  if (chunk.usage) showStats(view, timing, chunk.usage);
  return true;
}

async function ask(question) {
  const view = turnElement(question);
  const turn = { question, answer: "" };
  const timing = { start: performance.now(), firstToken: null };
  const body = requestBody(question);
  state.abort = new AbortController();
  setBusy(true);
  let ok = false;
  try {
    const res = await api("/v1/chat/completions", body, state.abort.signal);
    if (!res.ok) {
      show(view.error, await apiError(res));
      return;
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let going = true;
    while (going) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while (going && (end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          if (line.startsWith("data: ")) going = handleEvent(line.slice(6), view, timing, turn) && going;
        }
      }
    }
    ok = view.error.hidden;
  } catch (e) {
    show(view.error, e.name === "AbortError" ? "stopped" : `request failed: ${e.message}`);
    ok = false;
  } finally {
    setBusy(false);
    state.abort = null;
    view.el.dataset.done = "true";
  }
  if (ok && turn.answer) state.turns.push(turn); // a failed question is not part of the conversation
}

function setBusy(busy) {
  $("ask-button").disabled = busy;
  $("stop-button").hidden = !busy;
}

$("ask-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const question = $("question").value.trim();
  if (!question) return;
  if (!documentText()) {
    show($("connect-error"), "load or paste a document first");
    return;
  }
  show($("connect-error"), "");
  $("question").value = "";
  ask(question);
});

$("question").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("ask-form").requestSubmit();
  }
});

connect();
