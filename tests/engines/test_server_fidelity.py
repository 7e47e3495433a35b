"""The sampled fidelity estimator's client (kvlab.engines.server_fidelity): vLLM's prompt_logprobs read as vLLM
writes them, the estimate's arithmetic, seeds per item, and a server that cannot answer said in one line."""

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
