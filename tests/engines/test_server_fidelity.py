"""The sampled fidelity estimator's client (kvlab.engines.server_fidelity): vLLM's prompt_logprobs read as vLLM
writes them, SGLang's native /generate asked and read as SGLang's sources lay it out, the estimate's arithmetic,
seeds per item, and a server that cannot answer said in one line."""

from __future__ import annotations

import openai
import pytest

from kvlab.core.results import TEACHER_BASELINE_SAMPLE, Fidelity
from kvlab.engines.server_fidelity import (
    NOT_MEASURED,
    Reference,
    ScoringUnsupported,
    ServerScorer,
    continuation_scores,
    fidelity,
    item_seed,
)
from kvlab.engines.servers import serving_engine
from tests.serving import plain_openai_server

#: vLLM's prompt_logprobs for the prompt [5, 6] + continuation [7, 9] (JSON keys are strings; rank 1 is the top):
#: at position 2 the given token 7 is the top-1, at position 3 the given token 9 is second to token 8.
VLLM_PROMPT_LOGPROBS = [
    None,
    {"6": {"logprob": -1.5, "rank": 2, "decoded_token": "b"}, "1": {"logprob": -0.4, "rank": 1, "decoded_token": "x"}},
    {"7": {"logprob": -0.2, "rank": 1, "decoded_token": "c"}},
    {"9": {"logprob": -2.0, "rank": 2, "decoded_token": "e"}, "8": {"logprob": -0.3, "rank": 1, "decoded_token": "d"}},
]


def test_continuation_scores_read_vllms_shape():
    logprobs, top1 = continuation_scores(VLLM_PROMPT_LOGPROBS, 2, [7, 9])
    assert logprobs == [-0.2, -2.0] and top1 == [7, 8]


@pytest.mark.parametrize("entries, why", [
    (VLLM_PROMPT_LOGPROBS[:3], "do not cover the prompt"),
    ([None, {}, {"7": {"logprob": -0.2, "rank": 1}}, {"8": {"logprob": -0.3, "rank": 1}}],
     "lack the token at position 3"),
    (None, "do not cover the prompt"),
])
def test_scores_that_do_not_fit_the_prompt_are_refused(entries, why):
    with pytest.raises(ScoringUnsupported, match=why):
        continuation_scores(entries, 2, [7, 9])


SGLANG = serving_engine("sglang").scoring_api
#: SGLang's /generate answer to the sampling request for a prompt of ids [5, 6] that sampled [7, 9]
#: (logprob_start_len 0: every prompt token named, the first one's logprob None; [logprob, token_id, text] entries).
SGLANG_SAMPLED = {"text": " c e", "output_ids": [7, 9], "meta_info": {
    "id": "r1", "finish_reason": {"type": "length", "length": 2}, "prompt_tokens": 2, "completion_tokens": 2,
    "cached_tokens": 0, "input_token_logprobs": [[None, 5, None], [-1.5, 6, None]],
    "output_token_logprobs": [[-0.2, 7, None], [-2.0, 9, None]]}}
#: Its answer to the scoring request of [5, 6] + [7, 9] from logprob_start_len 1 (the prompt's last token, whose
#: entry is None): token 7 is the top-1 at its position, token 9 second to token 8.
SGLANG_SCORED = {"text": " d", "output_ids": [8], "meta_info": {
    "id": "r2", "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": 4, "completion_tokens": 1,
    "input_token_logprobs": [[None, 6, None], [-0.2, 7, None], [-2.0, 9, None]],
    "input_top_logprobs": [None, [[-0.2, 7, None]], [[-0.3, 8, None]]],
    "output_token_logprobs": [[-0.5, 8, None]], "output_top_logprobs": [[[-0.5, 8, None]]]}}


def test_sglang_is_asked_through_its_native_generate_with_plain_sampling():
    assert SGLANG is not None and SGLANG.path == "/generate"
    assert serving_engine("vllm").scoring_api is None  # vLLM's OpenAI completions answer prompt_logprobs
    sample = SGLANG.sample_body("Hello", 8, 42)
    assert sample["text"] == "Hello" and sample["return_logprob"] is True and sample["logprob_start_len"] == 0
    assert sample["sampling_params"].items() >= {  # SamplingParams' fields: plain sampling at temperature 1
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "max_new_tokens": 8, "sampling_seed": 42}.items()
    score = SGLANG.score_body((5, 6), (7, 9))
    assert score == {"input_ids": [5, 6, 7, 9], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                     "return_logprob": True, "logprob_start_len": 1, "top_logprobs_num": 1}


def test_sglangs_answers_are_read_as_its_sources_lay_them_out():
    assert SGLANG.sampled(SGLANG_SAMPLED) == ([5, 6], [7, 9])
    logprobs, top1 = SGLANG.scored(SGLANG_SCORED, (5, 6), (7, 9))
    assert logprobs == [-0.2, -2.0] and top1 == [7, 8]
    reference = Reference(prompt_ids=(5, 6), tokens=(7, 9), logprobs=(-0.1, -1.0), top1=(7, 8), seed=3)
    assert fidelity(reference, logprobs, top1).kl == pytest.approx((0.1, 1.0))


def _meta(answer: dict, **changes) -> dict:
    return answer | {"meta_info": answer["meta_info"] | changes}


@pytest.mark.parametrize("answer, why", [
    ({"text": "c e", "meta_info": {"id": "r1", "prompt_tokens": 2}}, "no prompt token ids"),  # no return_logprob
    (_meta(SGLANG_SAMPLED, input_token_logprobs=[[None, 6, None]]), "name 1 of the prompt's 2 tokens"),
    (_meta(SGLANG_SAMPLED, output_token_logprobs=None), "no output token ids"),
    (_meta(SGLANG_SAMPLED, finish_reason={"type": "abort", "message": "too long"}), "aborted the request: too long"),
    ("<html>not JSON</html>", "no meta_info"),
])
def test_sglang_samples_without_the_ids_are_refused(answer, why):
    with pytest.raises(ScoringUnsupported, match=why):
        SGLANG.sampled(answer)


@pytest.mark.parametrize("changes, why", [
    ({"input_token_logprobs": [[-0.2, 7, None], [-2.0, 9, None]]}, "do not cover the tokens sent"),
    ({"input_token_logprobs": [[None, 6, None], [-0.2, 7, None], [-2.0, 8, None]]}, "do not cover the tokens sent"),
    ({"input_top_logprobs": None}, "no input_top_logprobs"),
    ({"input_top_logprobs": [None, [[-0.2, 7, None]], None]}, "log-probabilities at position 3"),
    ({"input_token_logprobs": [[None, 6, None], [None, 7, None], [-2.0, 9, None]]}, "at position 2"),
])
def test_sglang_scores_that_do_not_fit_the_tokens_are_refused(changes, why):
    with pytest.raises(ScoringUnsupported, match=why):
        SGLANG.scored(_meta(SGLANG_SCORED, **changes), (5, 6), (7, 9))


def test_the_estimate_is_the_log_ratio_per_token_with_top1_agreement():
    reference = Reference(prompt_ids=(5, 6), tokens=(7, 9), logprobs=(-0.1, -1.0), top1=(7, 8), seed=3)
    estimate = fidelity(reference, [-0.2, -2.0], [7, 9])
    assert isinstance(estimate, Fidelity) and estimate.teacher == TEACHER_BASELINE_SAMPLE
    assert estimate.kl == pytest.approx((0.1, 1.0)) and estimate.agree == (True, False)
    assert estimate.first_divergence == 1 and estimate.mean_kl == pytest.approx(0.55)
    # one draw per position: a token the config finds likelier gives a negative term (unbiased, not clipped)
    assert fidelity(reference, [-0.05, -0.5], [7, 8]).kl == pytest.approx((-0.05, -0.5))
    with pytest.raises(ScoringUnsupported, match="1 of the continuation's 2"):
        fidelity(reference, [-0.2], [7])


def test_item_seeds_are_fixed_by_the_run_seed_and_the_item():
    assert item_seed(0, "passkey-1") == item_seed(0, "passkey-1")
    assert len({item_seed(0, f"passkey-{n}") for n in range(50)}) == 50
    assert item_seed(0, "passkey-1") != item_seed(1, "passkey-1")
    assert all(0 <= item_seed(seed, "x") < 2**31 - 1 for seed in (0, 1, 2**40))


@pytest.fixture
def text_only_server():
    with plain_openai_server() as base_url:
        yield base_url


def test_a_server_without_token_ids_or_prompt_logprobs_is_one_line(text_only_server):
    client = openai.OpenAI(base_url=text_only_server, api_key="no-key", max_retries=0)
    scorer = ServerScorer(client, lambda: "plain-model", lambda *_: None)
    why = scorer.why_not()
    assert why is not None and why.startswith(NOT_MEASURED) and "return_token_ids" in why and "\n" not in why
    assert scorer.probed and scorer.why_not() == why  # probed once, remembered
