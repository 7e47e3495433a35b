"""``kvlab serve`` as a real process on 127.0.0.1, driven by the real ``openai`` client."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvlab.core.results import KVMeasurement
from tests.serving import API_KEY

pytestmark = pytest.mark.model

MODEL = "smollm2-135m"
PROMPT = "The pass key is 48213. Remember it. 48213 is the pass key.\nWhat is the pass key? The pass key is"


@pytest.fixture
def client(kvlab_server):
    with openai.OpenAI(base_url=kvlab_server[1], api_key=API_KEY, max_retries=0) as client:
        yield client


def metric_samples(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics").text
    return {f"{s.name}{sorted(s.labels.items())}": s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_models_lists_the_served_model_and_its_kv_config(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["kvlab"]["kv_cache"]["quant"] == "none"
    assert models[0].model_extra["kvlab"]["per_request_kv_cache"] is True


def test_completion_answers_and_stops_before_the_stop_string(client):
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=["."])
    choice = response.choices[0]
    assert choice.text.strip() == "48213" and "." not in choice.text
    assert choice.finish_reason == "stop"
    assert response.usage.prompt_tokens > 20 and 1 <= response.usage.completion_tokens <= 8
    kv = response.model_extra["kv_cache"]
    assert kv["config"] == "baseline" and kv["physical_bytes"] == kv["baseline_bytes"] > 0
    assert kv["context_tokens"] == response.usage.prompt_tokens - 1
    assert (kv["estimated"], kv["source"]) == (False, "kvlab serve (measured)")
    measured = KVMeasurement.from_dict(kv)  # the block is the measurement, with the config and timings
    assert measured.to_dict().items() <= kv.items() and measured.compression_ratio == 1.0


def test_streaming_sends_text_before_the_answer_is_complete(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
    started = time.perf_counter()
    arrivals, pieces, usage = [], [], None
    for chunk in client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.perf_counter() - started)
            pieces.append(chunk.choices[0].text)
        usage = chunk.usage or usage
    assert "".join(pieces) == full
    assert len(pieces) >= 3 and arrivals[0] < arrivals[-1]  # the first token came before the last
    assert usage is not None and usage.completion_tokens == 12


def test_chat_completion_streams_an_assistant_message(client):
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                            max_tokens=6, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_a_request_may_carry_its_own_kv_cache_config(client):
    long_prompt = "Anne walked along the shore and thought of the letter. " * 12 + PROMPT  # > 4 blocks of 32
    response = client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=4, temperature=0,
                                         extra_body={"kv_cache": {"quant": "int4", "group_size": 32,
                                                                  "residual_length": 0}})
    kv = response.model_extra["kv_cache"]
    assert kv["config"].startswith("int4/g32") and kv["settings"]["residual_length"] == 0
    # Whole 32-token blocks are 4-bit codes (+ fp16 scales, zero points); the tail is still 16-bit.
    assert kv["physical_bytes"] < kv["baseline_bytes"] / 2


def test_a_request_may_compress_its_cache_while_it_generates(client):
    """A decode policy in the request: the cache is cut back during the answer, and the response's
    block says its size at the end beside its peak and its size after the prompt."""
    prompt = "Anne walked along the shore and thought of the letter. " * 12 + "\nShe wrote:"
    policy = {"evict": "streaming_llm", "decode": {"interval": 16, "target_tokens": 64}}
    response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=48, temperature=0,
                                         extra_body={"kv_cache": policy})
    kv = response.model_extra["kv_cache"]
    assert kv["config"] == "streaming_llm/dec16:t64" and response.usage.completion_tokens == 48
    per_token = kv["baseline_bytes"] / kv["context_tokens"]
    assert kv["physical_bytes"] == kv["baseline_bytes"]  # no prompt budget: the prompt is kept whole
    # cut to 64 tokens every 16 passes: at most 64 + 16 tokens at the end, far below the prompt
    assert kv["final_bytes"] <= (64 + 16) * per_token < kv["physical_bytes"] <= kv["peak_bytes"]


def test_a_request_may_ask_which_prompt_positions_each_head_kept(client):
    """``kv_cache_positions``: the response's block says, per layer and KV head, which prompt positions the
    compressed cache holds (one bitmap each), what a token map draws; without it the block leaves them out."""
    from kvlab.core.results import KeptPositions

    question = "\nWhat is the pass key? The pass key is"
    prompt = "Anne walked along the shore and thought of the letter. " * 8 + PROMPT.split("\n")[0] + question
    configs = {"streaming_llm": {"evict": "streaming_llm", "ratio": 0.75, "n_sink": 4},
               "snapkv": {"evict": "snapkv", "ratio": 0.75, "query_aware": True},
               "adakv": {"evict": "knorm", "ratio": 0.5, "heads": "adakv"}, "int4": {"quant": "int4"}}
    maps = {}
    for name, config in configs.items():
        response = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=2, temperature=0,
            extra_body={"kv_cache": config, "kv_cache_positions": True, "kv_cache_question_chars": len(question)})
        kv = response.model_extra["kv_cache"]
        maps[name] = positions = KeptPositions.from_dict(kv["kept_positions"])
        assert positions.tokens == kv["context_tokens"] and len(positions.kept) == 30
        assert all(len(heads) == 3 for heads in positions.kept)
        # the positions are the kept tokens: their count is the measured mean per head and layer
        counts = [len(p) for heads in positions.kept for p in heads]
        assert sum(counts) / len(counts) == pytest.approx(kv["kept_tokens"])
    tokens = maps["streaming_llm"].tokens
    kept = maps["streaming_llm"].kept[0][0]  # sinks and the most recent tokens, in every head and layer
    assert kept[:4] == (0, 1, 2, 3) and kept[-1] == tokens - 1 and len(set(maps["streaming_llm"].kept)) == 1
    share = maps["snapkv"].share()  # query-aware: the question, at the end of the prefix, kept everywhere
    assert share[-1] == 1.0 and min(share) < 1.0
    assert any(len({len(p) for p in heads}) > 1 for heads in maps["adakv"].kept)  # heads keep different counts
    assert maps["int4"].share() == [1.0] * maps["int4"].tokens  # quantized, nothing evicted
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0,
                                      extra_body={"kv_cache": configs["snapkv"]})
    assert "kept_positions" not in plain.model_extra["kv_cache"]


def test_tokenize_gives_the_ids_the_completion_reads_and_each_tokens_span(client, kvlab_server):
    """vLLM's /tokenize, with kvlab's ``return_offsets``: what a token map needs to shade the prompt's text."""
    root = kvlab_server[1].removesuffix("/v1")
    headers = {"Authorization": f"Bearer {API_KEY}"}
    answer = httpx.post(f"{root}/tokenize", headers=headers, json={
        "model": MODEL, "prompt": PROMPT, "return_token_strs": True, "return_offsets": True}).json()
    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0)
    assert answer["count"] == len(answer["tokens"]) == completion.usage.prompt_tokens
    assert len(answer["token_strs"]) == len(answer["offsets"]) == answer["count"]
    assert "".join(PROMPT[start:end] for start, end in answer["offsets"]) == PROMPT
    assert httpx.post(f"{root}/tokenize", json={"model": MODEL, "prompt": "x"}).status_code == 401
    refused = httpx.post(f"{root}/tokenize", headers=headers, json={"model": "other", "prompt": "x"})
    assert refused.status_code == 404 and "serves `smollm2-135m`" in refused.json()["error"]["message"]


def test_the_playground_runs_one_item_under_several_configs_with_their_token_maps(kvlab_server):
    """``/kvlab/playground``: a passkey item generated by the server, the baseline and 3 configs in one shared
    prefill; each answer with its bytes, its fidelity and the prompt positions its heads kept."""
    from kvlab.core.results import KeptPositions

    root = kvlab_server[1].removesuffix("/v1")
    headers = {"Authorization": f"Bearer {API_KEY}"}
    configs = [{"evict": "streaming_llm", "ratio": 0.75}, {"evict": "snapkv", "ratio": 0.75, "query_aware": True},
               {"quant": "int4", "value_quant": "int8"}]
    body = {"model": MODEL, "item": {"task": "passkey", "context_length": 512, "depth": 0.5, "seed": 3},
            "configs": configs}
    answer = httpx.post(f"{root}/kvlab/playground", headers=headers, json=body, timeout=120).json()
    item, results = answer["item"], answer["results"]
    assert [r["config"] for r in results] == ["baseline", "streaming_llm:r0.75", "snapkv:r0.75/qa",
                                              "k:int4/v:int8/g64/r64"]
    assert item["answer"] in item["context"] and results[0]["score"] == 1.0 and results[0]["mean_kl"] is None
    needle = item["context"].index(item["answer"])
    offsets = answer["context_offsets"]
    for result in results:
        positions = KeptPositions.from_dict(result["kept_positions"])
        assert positions.tokens == result["context_tokens"]
        assert (result["score"] == 1.0) == (item["answer"] in result["generated"])
        if result["config"] != "baseline":
            assert result["mean_kl"] is not None and 0 <= result["agreement"] <= 1
        # the needle's tokens: StreamingLLM (sinks and the recent window) drops them all from the middle
        share = positions.share()
        in_needle = [share[i] for i, (start, end) in enumerate(offsets) if start < needle + 5 and end > needle]
        assert in_needle and (max(in_needle) == 0.0) == (result["config"] == "streaming_llm:r0.75")
    assert results[1]["score"] == 0.0 and results[1]["physical_bytes"] < results[0]["physical_bytes"] / 3
    # the query-aware config's prefix holds the question (all but its last token) after the context
    assert KeptPositions.from_dict(results[2]["kept_positions"]).tokens == len(offsets) + len(
        answer["question_offsets"]) - 1
    bad = httpx.post(f"{root}/kvlab/playground", headers=headers, json=body | {"configs": [{"evict": "tova",
                                                                                            "heads": "adakv"}]})
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("configs.0: heads = 'adakv'")
    long = httpx.post(f"{root}/kvlab/playground", headers=headers, json=body | {
        "item": {"task": "passkey", "context_length": 9000}})
    assert long.status_code == 400 and "maximum context of 8192" in long.json()["error"]["message"]
    # the caller's own text, scored by its answer scorer
    context, question = PROMPT.split("\n")
    own = {"model": MODEL, "item": {"context": context, "question": "\n" + question, "answer": "48213",
                                    "scorer": "contains"}, "max_new_tokens": 6}
    answer = httpx.post(f"{root}/kvlab/playground", headers=headers, json=own, timeout=60).json()
    assert [(r["config"], r["score"]) for r in answer["results"]] == [("baseline", 1.0)]
    refused = httpx.post(f"{root}/kvlab/playground", headers=headers, json=own | {"item": own["item"] | {
        "scorer": "psychic"}})
    assert refused.status_code == 400


@pytest.mark.parametrize("api_key", [None, "wrong-key", f" {API_KEY}x"])
def test_requests_without_the_right_key_are_refused(kvlab_server, api_key):
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    response = httpx.get(f"{kvlab_server[1]}/models", headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    with openai.OpenAI(base_url=kvlab_server[1], api_key=api_key or "no-key", max_retries=0) as bad, \
            pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_health_and_metrics_need_no_key(kvlab_server):
    root = kvlab_server[1].removesuffix("/v1")
    assert httpx.get(f"{root}/health").status_code == 200
    assert "kvlab:kv_cache_bytes" in httpx.get(f"{root}/metrics").text


def test_unknown_model_and_bad_settings_get_openai_errors(client):
    with pytest.raises(openai.NotFoundError, match=f"serves `{MODEL}`"):
        client.completions.create(model="gpt-4o", prompt=PROMPT, max_tokens=2, temperature=0)
    with pytest.raises(openai.BadRequestError, match="kv_cache.quant"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0,
                                  extra_body={"kv_cache": {"quant": "int3"}})
    with pytest.raises(openai.BadRequestError, match=r"temperature must be in \[0, 2\]"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=-0.7)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 8192"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=9000, temperature=0)


def test_metrics_count_requests_tokens_and_time_to_first_token(kvlab_server, client):
    before = metric_samples(kvlab_server[1])
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
    after = metric_samples(kvlab_server[1])
    label = [("model_name", MODEL)]
    assert after[f"kvlab:time_to_first_token_seconds_count{label}"] == \
        before.get(f"kvlab:time_to_first_token_seconds_count{label}", 0) + 1
    requests = (f"kvlab:requests_total"
                f"{sorted({'endpoint': '/v1/completions', 'model_name': MODEL, 'status': '200'}.items())}")
    assert after[requests] == before.get(requests, 0) + 1
    assert after[f"kvlab:generation_tokens_total{label}"] - before.get(f"kvlab:generation_tokens_total{label}", 0) == 3
    assert after[f"kvlab:kv_cache_bytes{label}"] == 0  # idle: no request holds a cache now


@pytest.mark.parametrize("kv_cache", [None, {"evict": "snapkv", "ratio": 0.5}])
def test_a_one_token_prompt_is_answered(client, kv_cache):
    """Nothing to prefill or evict (the doctor's probe sends such a prompt)."""
    response = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0,
                                         extra_body={"kv_cache": kv_cache} if kv_cache else None)
    assert response.usage.prompt_tokens == 1 and response.usage.completion_tokens == 3
    assert response.model_extra["kv_cache"]["physical_bytes"] == 0  # the one token is fed after the (empty) prefix
