"""lm-eval (a client nobody here wrote) against our server: a multiple-choice task through `local-completions`
(loglikelihood: token-id prompts, echo, logprobs 1, max_tokens 1; tokenized by our /tokenize, /detokenize,
/tokenizer_info) and a generation task through `local-chat-completions`. The loglikelihoods lm-eval records equal the
offline engine's for the same tokens."""

from __future__ import annotations

import json

import pytest

from infinitehip import LLM, SamplingParams
from infinitehip.config.engine import EngineConfig
from infinitehip.config.server import ServerConfig
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.server.app import create_app
from tests.server.test_server import ServerThread

lm_eval = pytest.importorskip("lm_eval")

CONFIG = dict(max_context_tokens=1024, kv_cache_tokens=8192, max_num_seqs=8, prefill_chunk_size=256, device="cpu",
              dtype="float32", show_progress=False)
DOCS = [("France", "Paris", ["Paris", "Rome", "Madrid"]), ("Italy", "Rome", ["Berlin", "Rome", "Lisbon"]),
        ("Japan", "Tokyo", ["Seoul", "Beijing", "Tokyo"]), ("Germany", "Berlin", ["Berlin", "Vienna", "Paris"])]


def _tasks(tmp_path) -> str:
    data = tmp_path / "capitals.jsonl"
    data.write_text("".join(json.dumps({"country": c, "capital": a, "choices": ch, "answer": ch.index(a)}) + "\n"
                            for c, a, ch in DOCS))
    common = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}}, "test_split": "test"}
    mc = {**common, "task": "capitals_mc", "output_type": "multiple_choice",
          "doc_to_text": "Question: What is the capital of {{country}}?\nAnswer:", "doc_to_choice": "{{choices}}",
          "doc_to_target": "{{answer}}", "metric_list": [{"metric": "acc"}]}
    gen = {**common, "task": "capitals_gen", "output_type": "generate_until",
           "doc_to_text": "What is the capital of {{country}}? Answer with the city only.", "doc_to_target": "{{capital}}",
           "generation_kwargs": {"until": ["\n"], "max_gen_toks": 8, "do_sample": False},
           "metric_list": [{"metric": "exact_match", "ignore_case": True, "ignore_punctuation": True}]}
    for task in (mc, gen):  # lm-eval reads YAML; JSON is YAML
        (tmp_path / f"{task['task']}.yaml").write_text(json.dumps(task))
    return str(tmp_path)


def test_lm_eval_loglikelihood_and_generation_through_our_server(tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    engine = LLMEngine(EngineConfig(**CONFIG))
    manager = TaskManager(include_path=_tasks(tmp_path))
    with ServerThread(create_app(engine, ServerConfig(served_model_name="smol"))) as url:
        mc = simple_evaluate(model="local-completions", tasks=["capitals_mc"], task_manager=manager, log_samples=True,
                             model_args=f"base_url={url}/v1/completions,model=smol,num_concurrent=1,max_retries=1")
        gen = simple_evaluate(model="local-chat-completions", tasks=["capitals_gen"], task_manager=manager,
                              apply_chat_template=True, log_samples=True,
                              model_args=f"base_url={url}/v1/chat/completions,model=smol,max_retries=1,"
                                         "tokenized_requests=False")
    assert mc["results"]["capitals_mc"]["acc,none"] >= 0.5  # 4 easy questions, 3 choices each
    assert len(gen["samples"]["capitals_gen"]) == len(DOCS)
    assert all(s["resps"][0][0].strip() for s in gen["samples"]["capitals_gen"])  # a non-empty answer each

    offline = LLM.from_engine(LLMEngine(EngineConfig(**CONFIG), engine.loaded))  # (the same weights, not reloaded)
    tok = offline.tokenizer
    pairs = [(args, resp) for sample in mc["samples"]["capitals_mc"]
             for args, resp in zip(sample["arguments"], sample["resps"])]
    assert len(pairs) == sum(len(choices) for *_, choices in DOCS)
    for (context, continuation, *_), resp in pairs:
        ctx = tok(context, add_special_tokens=False)["input_ids"]
        cont = tok(continuation, add_special_tokens=False)["input_ids"]
        (ref,) = offline.generate([ctx + cont], SamplingParams(temperature=0.0, max_tokens=1, logprobs=1,
                                                               prompt_logprobs=1))
        want = sum(e.logprob for e in ref.prompt_logprobs[len(ctx) - 1 :])
        assert abs(resp[0][0] - want) < 1e-4, (context, continuation, resp, want)
