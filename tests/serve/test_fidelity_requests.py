"""What the sampled fidelity estimator asks of ``kvlab serve``, in vLLM's fields and shapes, through the real
``openai`` client: a seeded sample with its token ids (``seed``, ``return_token_ids``), then the prompt and
that continuation scored under each config (``prompt_logprobs``, kvlab's ``kv_cache_prompt_split``)."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import openai
import pytest
import torch
from scipy import stats

from kvlab.core.experiment_spec import TaskSpec
from kvlab.core.kv_config import KVCacheConfig
from kvlab.engines.batched_decode import token_kl
from kvlab.paths import engine_venv
from kvlab.tasks.registry import generate_items
from tests.serving import API_KEY

pytestmark = pytest.mark.model

MODEL = "smollm2-135m"
PROMPT = "The pass key is 48213. Remember it. 48213 is the pass key.\nWhat is the pass key? The pass key is"
STORY = "Anne walked along the shore and thought of the letter. " * 12 + "\nShe wrote:"
INT4 = {"quant": "int4", "group_size": 32, "residual_length": 0}
SNAPKV = {"evict": "snapkv", "ratio": 0.5}


@contextmanager
def one_thread():
    """The served engine's thread count (``--threads 1``): a float32 sum in another order can round a key or value
    to the other side of a 16-bit step in the cache, and move a log-probability by up to ~3e-3."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def client(kvlab_server):
    with openai.OpenAI(base_url=kvlab_server[1], api_key=API_KEY, max_retries=0) as client:
        yield client


def sample(client, prompt: str, seed: int | None, temperature: float = 1.0, max_tokens: int = 12, **extra):
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=temperature,
                                     seed=seed, extra_body={"return_token_ids": True, **extra})


def extra(obj, name: str):
    return (obj.model_extra or {}).get(name)


def test_sampling_repeats_per_seed_and_temperature_0_stays_greedy(client):
    """temperature 1 with a seed: the same tokens for the same seed, others for another, streamed or not (the
    prompt's ids on the first chunk, each chunk's own ids after, as vLLM sends them); temperature 0 ignores the
    seed and answers greedily."""
    first, again, other = (sample(client, STORY, seed) for seed in (7, 7, 8))
    ids = [extra(r.choices[0], "token_ids") for r in (first, again, other)]
    assert ids[0] == ids[1] and ids[0] != ids[2] and len(ids[0]) == 12
    assert first.choices[0].text == again.choices[0].text != other.choices[0].text
    prompt_ids = extra(first.choices[0], "prompt_token_ids")
    assert len(prompt_ids) == first.usage.prompt_tokens and prompt_ids[-1] != ids[0][0]
    assert first.choices[0].text == client.completions.create(  # the same draw without the ids
        model=MODEL, prompt=STORY, max_tokens=12, temperature=1.0, seed=7).choices[0].text
    chunks = list(client.completions.create(model=MODEL, prompt=STORY, max_tokens=12, temperature=1.0, seed=7,
                                            stream=True, extra_body={"return_token_ids": True}))
    assert extra(chunks[0].choices[0], "prompt_token_ids") == prompt_ids
    assert all(extra(c.choices[0], "prompt_token_ids") is None for c in chunks[1:])
    assert [t for c in chunks for t in extra(c.choices[0], "token_ids")] == ids[0]
    assert "".join(c.choices[0].text for c in chunks) == first.choices[0].text
    greedy = [extra(sample(client, PROMPT, seed, temperature=0, max_tokens=6).choices[0], "token_ids")
              for seed in (1, 2, None)]
    assert greedy[0] == greedy[1] == greedy[2]
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0).choices[0].text \
        .startswith(" 48213")


def test_prompt_logprobs_have_vllms_shape_and_the_baseline_scores_as_a_plain_forward(client, smollm):
    """One entry per prompt token: None, then ``{token id: {logprob, rank, decoded_token}}`` holding the prompt's
    token first and the top ``k`` ranked 1..k; under the baseline without a split, every position is the model's
    own float32 forward pass over the ids."""
    ids = smollm.tokenizer(PROMPT)["input_ids"]
    response = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0,
                                         extra_body={"prompt_logprobs": 2})
    entries = extra(response.choices[0], "prompt_logprobs")
    assert len(entries) == len(ids) and entries[0] is None
    with torch.no_grad():
        logprobs = torch.log_softmax(smollm.model(torch.tensor([ids])).logits[0].float(), dim=-1)
    worst = 0.0
    for position, (entry, token) in enumerate(zip(entries[1:], ids[1:], strict=True)):
        row = logprobs[position]
        assert next(iter(entry)) == str(token) and 2 <= len(entry) <= 3
        assert set(entry[str(token)]) == {"logprob", "rank", "decoded_token"}
        assert entry[str(token)]["rank"] == int((row >= row[token]).sum())
        assert entry[str(token)]["decoded_token"] == smollm.tokenizer.decode([token])
        top = row.topk(2).indices.tolist()
        assert [entry[str(t)]["rank"] for t in top] == [1, 2]
        worst = max([worst, *(abs(entry[key]["logprob"] - row[int(key)].item()) for key in entry)])
    assert worst < 1e-4
    kv = response.model_extra
    assert kv["kv_cache_prompt_split"] == [len(ids) - 1, 1] and kv["kv_cache"]["config"] == "baseline"
    # not asked: vLLM's fields are null
    plain = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0).choices[0]
    assert (extra(plain, "prompt_logprobs"), extra(plain, "prompt_token_ids"), extra(plain, "token_ids")) == (None,) * 3


def score(client, prompt: list[int], tokens: list[int], split: list[int],
          config: dict | None) -> tuple[list[float], list[int]]:
    """Each continuation token's log-probability under ``config`` and the top token at its position (rank 1),
    read from ``prompt_logprobs`` as a client reads vLLM's."""
    response = client.completions.create(
        model=MODEL, prompt=prompt + tokens, max_tokens=1, temperature=0,
        extra_body={"prompt_logprobs": 1, "kv_cache_prompt_split": split} | ({"kv_cache": config} if config else {}))
    entries = extra(response.choices[0], "prompt_logprobs")[len(prompt):]
    return ([entry[str(t)]["logprob"] for entry, t in zip(entries, tokens, strict=True)],
            [int(next(k for k, v in entry.items() if v["rank"] == 1)) for entry in entries])


def gap(served: list[float], rows: torch.Tensor, tokens: list[int]) -> float:
    """The largest difference between served log-probabilities of ``tokens`` and the engine's rows."""
    return (torch.tensor(served) - rows.gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1)).abs().max().item()


def test_the_sampled_estimate_agrees_with_the_exact_kl_on_20_items(client, engine):
    """The estimator end to end: the baseline samples each item's continuation (temperature 1, seeded), the
    baseline and each config score prompt + continuation (``prompt_logprobs``, with the sample's split); the
    per-token log-ratio is an unbiased estimate of KL(p_baseline || p_config) along that trajectory.  The
    embedded engine computes the exact KL of the same tokens: its mean over 20 items lies within the estimate's
    95% interval, and the served log-probabilities and top tokens are the engine's own.  (The engine here works
    on one core while the server works on the other.)"""
    items = generate_items(TaskSpec(name="passkey", context_lengths=[256], num_items=20), engine.tokenizer, seed=35)
    configs = {"baseline": None, "int4": INT4, "snapkv": SNAPKV}

    def exact_rows(prompt: list[int], split: list[int], tokens: list[int]) -> dict[str, torch.Tensor]:
        context, question = prompt[:split[0]], prompt[split[0]:sum(split)]
        with one_thread():
            return {name: engine.forced_logprobs(context, question, tokens, KVCacheConfig(**config or {}))
                    for name, config in configs.items()}

    served, pending = [], []
    with ThreadPoolExecutor(1) as in_process:
        for number, item in enumerate(items):
            drawn = sample(client, item.context + item.question, 100 + number, max_tokens=16,
                           kv_cache_question_chars=len(item.question))
            prompt, tokens = extra(drawn.choices[0], "prompt_token_ids"), extra(drawn.choices[0], "token_ids")
            split = drawn.model_extra["kv_cache_prompt_split"]
            assert sum(split) == len(prompt) and len(tokens) >= 1
            pending.append(in_process.submit(exact_rows, prompt, split, tokens))
            served.append((tokens, {name: score(client, prompt, tokens, split, config)
                                    for name, config in configs.items()}))
        exact = [future.result() for future in pending]
    estimates: dict[str, list[float]] = {name: [] for name in configs if name != "baseline"}
    kl: dict[str, list[float]] = {name: [] for name in estimates}
    agreement: dict[str, list[float]] = {name: [] for name in estimates}
    for (tokens, scores), rows in zip(served, exact, strict=True):
        for name, (logprobs, top1) in scores.items():
            assert gap(logprobs, rows[name], tokens) < 1e-4 and top1 == rows[name].argmax(dim=-1).tolist()
        base = scores["baseline"][0]
        for name in estimates:
            estimates[name].append(statistics.fmean(p - q for p, q in zip(base, scores[name][0], strict=True)))
            kl[name].append(token_kl(rows["baseline"], rows[name]).mean().item())
            agreement[name].append(statistics.fmean(
                a == b for a, b in zip(scores["baseline"][1], scores[name][1], strict=True)))
    quantile = stats.t.ppf(0.975, len(items) - 1)
    for name in estimates:
        mean, sd = statistics.fmean(estimates[name]), statistics.stdev(estimates[name])
        half = quantile * sd / math.sqrt(len(items))
        truth = statistics.fmean(kl[name])
        print(f"{name}: sampled {mean:.4f} [{mean - half:.4f}, {mean + half:.4f}], exact {truth:.4f}, "
              f"agreement {statistics.fmean(agreement[name]):.3f}")
        assert mean > 0 and truth > 0
        assert mean - half <= truth <= mean + half


def test_teacher_forced_scores_are_the_configs_own_decoding(engine):
    """The scored continuation goes through the cache the config leaves as its own decoding feeds it: scoring the
    config's own greedy answer gives, at every position, that answer's token as the top one -- through a
    quantized tail moved into codes on the way, eviction (query-aware too) and a decode-time policy."""
    ids = engine.tokenizer(STORY)["input_ids"]
    context, question = ids[:-4], ids[-4:]
    for config in (KVCacheConfig(**INT4), KVCacheConfig(**SNAPKV, query_aware=True),
                   KVCacheConfig(evict="knorm", ratio=0.5, quant="int4", group_size=32, residual_length=0,
                                 decode={"interval": 4, "target_tokens": 80})):
        answer = [t for t in engine.stream(context, question, config, 20) if isinstance(t, int)]
        rows = engine.forced_logprobs(context, question, answer, config)
        assert rows.argmax(dim=-1).tolist() == answer, config.label


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"temperature": -1.0}, "temperature", "temperature must be in [0, 2]"),
    ({"temperature": 2.5}, "temperature", "temperature must be in [0, 2]"),
    ({"prompt_logprobs": -2}, "prompt_logprobs", "prompt_logprobs must be 0 to 20"),
    ({"prompt_logprobs": 1000}, "prompt_logprobs", "Requested prompt logprobs of 1000, which is greater than max "
                                                   "allowed: 20"),
    # vLLM's -1 is the whole vocabulary at every position (refused by vLLM too at its default --max-logprobs)
    ({"prompt_logprobs": -1}, "prompt_logprobs", "prompt_logprobs = -1 asks for the whole vocabulary (49,152 tokens) "
                                                 "at every prompt position; at most 20 top tokens per position are "
                                                 "returned: ask for 0 to 20"),
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs", "not available when stream=True"),
    ({"kv_cache_prompt_split": [20, 5]}, "kv_cache_prompt_split", "at most the prompt's 8 tokens; got [20, 5]"),
    ({"kv_cache_prompt_split": [3, 0]}, "kv_cache_prompt_split", "the question's at least 1"),
    ({"kv_cache_prompt_split": [3]}, "kv_cache_prompt_split", "two counts"),
    ({"top_k": 5}, "top_k", "top_k = 5 is not supported"),
    ({"repetition_penalty": 1.2}, "repetition_penalty", "leave it unset or 1"),
    ({"logprobs": 2}, "logprobs", "send the tokens to score as the prompt, with prompt_logprobs"),
    ({"echo": True}, "echo", "echo"),
])
def test_bad_sampling_and_scoring_fields_get_one_400_naming_the_field(client, fields, param, words):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=list(range(100, 108)), max_tokens=2, temperature=0,
                                  extra_body=fields)
    assert refused.value.status_code == 400 and refused.value.body["param"] == param
    assert words in refused.value.body["message"]


def test_neutral_sampling_fields_are_accepted(client):
    """vLLM's plain-sampling values (what a client sends to make any server sample the model's own distribution)."""
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=1.0, seed=3, top_p=1.0,
                                         extra_body={"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0})
    assert response.usage.completion_tokens == 3


#: Run in vLLM's own venv: every request and response kvlab serve exchanged, read by vLLM 0.32's own protocol
#: models (``vllm/entrypoints/openai/{completion,chat_completion}/protocol.py``).  A request's fields must be
#: vLLM's (or kvlab's ``kv_cache*``); a response's fields vLLM's (or kvlab's), each read back by vLLM's model and
#: written out again unchanged.
VLLM_READS = """
import json, sys
from vllm.entrypoints.openai.completion.protocol import (
    CompletionRequest, CompletionResponse, CompletionStreamResponse)
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest, ChatCompletionResponse, ChatCompletionStreamResponse)
MODELS = {"completion": (CompletionRequest, CompletionResponse),
          "chat": (ChatCompletionRequest, ChatCompletionResponse),
          "completion_chunk": (CompletionRequest, CompletionStreamResponse),
          "chat_chunk": (ChatCompletionRequest, ChatCompletionStreamResponse)}
OURS = {"kv_cache", "kv_cache_question_chars", "kv_cache_prompt_split", "kv_cache_positions"}
def same(ours, theirs):  # theirs holds ours: equal, but for the fields vLLM adds at their defaults (None)
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return all(same(ours.get(k), theirs.get(k)) for k in ours.keys() | {k for k, v in theirs.items() if v})
    if isinstance(ours, list) and isinstance(theirs, list):
        return len(ours) == len(theirs) and all(same(a, b) for a, b in zip(ours, theirs))
    return ours == theirs
problems = []
for kind, request, response in json.load(sys.stdin):
    asks, answers = MODELS[kind]
    problems += [f"{kind} request: {k} is not vLLM's" for k in set(request) - set(asks.model_fields) - OURS]
    asks.model_validate(request)
    problems += [f"{kind} response: {k} is not vLLM's" for k in set(response) - set(answers.model_fields) - OURS]
    read = json.loads(answers.model_validate(response).model_dump_json())
    choice_model = answers.model_fields["choices"].annotation.__args__[0]
    for ours, theirs in zip(response["choices"], read["choices"]):
        problems += [f"{kind} choice: {k} is not vLLM's" for k in set(ours) - set(choice_model.model_fields)]
        problems += [f"{kind} choice: {k} reads back as {str(theirs[k])[:80]}" for k in ours
                     if not same(ours[k], theirs[k])]
    problems += [f"{kind}: {k} reads back as {str(read[k])[:80]}" for k in set(response) - OURS - {"choices"}
                 if not same(response[k], read[k])]
print(json.dumps(problems))
"""


def test_vllm_reads_kvlab_serves_requests_and_answers_as_its_own(client):
    """The fields and shapes are vLLM's, checked by vLLM itself: the estimator's sample and scoring requests,
    streamed and whole, completions and chat, parsed by vLLM 0.32's protocol models in its own venv."""
    python = engine_venv("vllm") / "bin" / "python"
    if not python.exists():
        pytest.skip(f"vLLM is not installed in {engine_venv('vllm')}: run scripts/install_vllm.sh")
    exchanges = []

    def exchange(kind: str, request: dict) -> dict:
        """Send ``request`` (vLLM's fields beside the prompt go in ``extra_body``); the (last) answer's JSON."""
        fields = {k: v for k, v in request.items() if k not in ("prompt", "messages", "stream")}
        create = client.chat.completions.create if kind.startswith("chat") else client.completions.create
        body = {"model": MODEL, "stream": kind.endswith("chunk")} | {
            k: request[k] for k in ("prompt", "messages") if k in request}
        answer = create(**body, extra_body=fields)
        for part in answer if body["stream"] else [answer]:
            exchanges.append([kind, body | fields, part.model_dump(exclude_unset=True)])
        return exchanges[-1][2]

    drawn = {"prompt": STORY, "max_tokens": 6, "temperature": 1.0, "seed": 5, "return_token_ids": True,
             "kv_cache_question_chars": 11}
    sampled = exchange("completion", drawn)
    exchange("completion_chunk", drawn | {"stream": True})
    prompt, tokens = sampled["choices"][0]["prompt_token_ids"], sampled["choices"][0]["token_ids"]
    scored = exchange("completion", {"prompt": prompt + tokens, "max_tokens": 1, "temperature": 0,
                                     "prompt_logprobs": 3, "kv_cache": INT4,
                                     "kv_cache_prompt_split": sampled["kv_cache_prompt_split"]})
    assert scored["choices"][0]["prompt_logprobs"][0] is None and len(scored["choices"][0]["prompt_logprobs"]) == len(
        prompt + tokens)
    chat = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0,
            "return_token_ids": True}
    answered = exchange("chat", chat | {"prompt_logprobs": 1})
    assert len(answered["prompt_logprobs"]) == len(answered["prompt_token_ids"]) == answered["usage"]["prompt_tokens"]
    assert answered["choices"][0]["token_ids"]
    exchange("chat_chunk", chat | {"stream": True})
    checked = subprocess.run([str(python), "-c", VLLM_READS], input=json.dumps(exchanges), capture_output=True,
                             text=True, timeout=300)
    assert checked.returncode == 0, checked.stderr[-2000:]
    problems = json.loads(checked.stdout.strip().splitlines()[-1])
    assert not problems, "\n".join(problems)
