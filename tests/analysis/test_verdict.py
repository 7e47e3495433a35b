"""The sweet-spot rule task by task, on hand-made results: intersection over tasks, fidelity and
accuracy margins at their boundaries (bounds computed here with scipy.stats), the chance floor,
and the fallbacks without a fidelity margin or without fidelity measured."""

from __future__ import annotations

import math
import statistics

import pytest
from scipy import stats

from kvlab.analysis.decision import PairedScores, holm
from kvlab.analysis.summary import decide, summarize
from kvlab.analysis.verdict import ACCURACY, FIDELITY, NEITHER, judge_tasks
from kvlab.core.margins import RULE, Margins
from kvlab.core.results import Fidelity, ItemResult
from kvlab.experiments.report import decision_text

BASELINE_BYTES = 1000


def _row(config: str, item: int, score: float, task: str = "passkey", physical: int = BASELINE_BYTES,
         kl: list[float] | None = None, extra: dict | None = None) -> ItemResult:
    """One item's result; ``kl``: the config's per-token KL against the baseline (every token agreeing)."""
    extra = dict(extra or {})
    if kl is not None:
        extra["fidelity"] = Fidelity(tuple(kl), (True,) * len(kl)).to_dict()
    return ItemResult(
        item_id=f"{task}-{item}", task=task, config_name=config, config={"name": config}, seed=0, context_length=512,
        depth=0.5, prompt_tokens=520, context_tokens=512, kept_tokens=512.0, kept_fraction=1.0,
        baseline_kv_bytes=BASELINE_BYTES, physical_kv_bytes=physical, analytic_kv_bytes=physical,
        compression_ratio=BASELINE_BYTES / physical, peak_kv_bytes=physical, generated="", answer="",
        output_tokens=len(kl or [0]), ttft_s=0.1, tpot_s=0.01, prefill_s=0.05, compress_s=0.01, decode_s=0.01,
        peak_memory_bytes=None, score=score, extra=extra)


def _rows(config: str, scores: list[float], task: str = "passkey", physical: int = BASELINE_BYTES,
          item_kl: list[float] | None = None, extra: dict | None = None) -> list[ItemResult]:
    """A config's items; ``item_kl``: each item's mean KL (two tokens, 0.002 either side of it)."""
    kls = [[m - 0.002, m + 0.002] for m in item_kl] if item_kl is not None else [None] * len(scores)
    return [_row(config, i, s, task, physical, kl, extra) for i, (s, kl) in enumerate(zip(scores, kls, strict=True))]


def _by_name(results: list[ItemResult], margins: Margins):
    return {s.config_name: s for s in summarize(results, margins=margins)}


# -- (a) every task must accept: pooled accuracy is a summary, never the decision ---------------------

ACCURACY_ONLY = Margins(max_drop=0.1, max_kl=0.0)


def _two_tasks(with_safe_config: bool) -> list[ItemResult]:
    # task A: 1000 items, the config perfect; task B: 100 items, the config right on half of them
    rows = _rows("baseline", [1.0] * 1000, "A") + _rows("baseline", [1.0] * 100, "B")
    rows += _rows("cheap", [1.0] * 1000, "A", physical=250) + _rows("cheap", [1.0] * 50 + [0.0] * 50, "B", physical=250)
    if with_safe_config:
        rows += _rows("safe", [1.0] * 1000, "A", physical=500) + _rows("safe", [1.0] * 100, "B", physical=500)
    return rows


def test_pooled_pass_does_not_hide_a_failing_task():
    rows = _two_tasks(with_safe_config=False)
    cheap = _by_name(rows, ACCURACY_ONLY)["cheap"]
    # pooled over 1100 items the config loses 50 (4.5 points): non-inferior within 0.1...
    pooled = PairedScores.of([1.0] * 1100, [1.0] * 1050 + [0.0] * 50)
    assert pooled.interval()[0] > -0.1
    assert cheap.pooled_non_inferior is True
    # ...but on task B it loses half: rejected there, so rejected
    assert cheap.non_inferior is False
    assert cheap.stopped_by.task == "B" and cheap.stopped_by.criterion == ACCURACY
    verdicts = {v.task: v for v in cheap.task_verdicts}
    assert verdicts["A"].accepted is True and verdicts["B"].accepted is False
    assert cheap.decided_by == "A: accuracy, B: accuracy"
    decision = decide(list(_by_name(rows, ACCURACY_ONLY).values()))
    assert decision.sweet_spot is None and "B stopped them" in decision.note


def test_the_sweet_spot_is_the_config_every_task_accepts():
    summaries = _by_name(_two_tasks(with_safe_config=True), ACCURACY_ONLY)
    assert summaries["cheap"].compression_ratio > summaries["safe"].compression_ratio
    assert summaries["cheap"].pooled_non_inferior is True  # the more compressed one passes pooled...
    decision = decide(list(summaries.values()))
    assert decision.sweet_spot.config_name == "safe"  # ...but only the other is acceptable on every task
    # and the decision says which task bound it: B refused the more compressed one that A accepted
    assert decision.bound == "bound by B: it refused cheap (while A accepted cheap)"
    assert decision.to_dict()["bound_by"] == decision.bound
    assert "\nbound by B: it refused cheap (while A accepted cheap)\n" in decision_text(decision)


# -- (b) the fidelity margin at its boundary, Holm across two configs ---------------------------------

MAX_KL = 0.05
KL_MARGINS = Margins(max_kl=MAX_KL)
DEVIATIONS = [-2.0, -1.0, 0.0, 1.0, 2.0]  # item means around each config's mean, in units of SPREAD
SPREAD = 0.004
N = len(DEVIATIONS)
SE = statistics.stdev([d * SPREAD for d in DEVIATIONS]) / math.sqrt(N)


def _item_means(upper_at: float, above: bool) -> list[float]:
    """Item means whose one-sided t upper bound at level ``1 - upper_at`` lies just below (or just
    above) MAX_KL: mean = MAX_KL - t * SE, with t 1% off the quantile."""
    t = stats.t.ppf(1 - upper_at, N - 1) * (0.99 if above else 1.01)
    mean = MAX_KL - t * SE
    return [mean + d * SPREAD for d in DEVIATIONS]


def _upper_bound(item_means: list[float], upper_at: float) -> float:
    """The one-sided upper t bound of the mean KL, by hand."""
    n = len(item_means)
    se = statistics.stdev(item_means) / math.sqrt(n)
    return statistics.fmean(item_means) + stats.t.ppf(1 - upper_at, n - 1) * se


def _p_by_hand(item_means: list[float]) -> float:
    """One-sided p of H0: mean KL >= MAX_KL, by hand."""
    se = statistics.stdev(item_means) / math.sqrt(len(item_means))
    return float(stats.t.cdf((statistics.fmean(item_means) - MAX_KL) / se, len(item_means) - 1))


def _fidelity_rows(configs: dict[str, list[float]]) -> list[ItemResult]:
    """Baseline and configs all right on every item (accuracy never shown to drop), with the configs'
    item-mean KLs as given."""
    rows = _rows("baseline", [1.0] * N)
    for index, (name, means) in enumerate(configs.items()):
        rows += _rows(name, [1.0] * N, physical=200 + 100 * index, item_kl=means)
    return rows


def _verdict(rows: list[ItemResult], config: str, margins: Margins = KL_MARGINS):
    (verdict,) = judge_tasks(rows, "baseline", margins)[config]
    return verdict


@pytest.mark.parametrize("above", [False, True])
def test_fidelity_bound_at_the_margin_one_config(above):
    means = _item_means(0.025, above)
    assert bool(_upper_bound(means, 0.025) > MAX_KL) is above  # the case is what it says
    verdict = _verdict(_fidelity_rows({"x": means}), "x")
    assert verdict.criterion == FIDELITY and verdict.accepted is (not above)
    assert verdict.p_adjusted == pytest.approx(_p_by_hand(means), rel=1e-6)
    assert ("not certified" in verdict.reason) is above


def test_holm_across_two_configs_steps_down():
    # x's bound clears the margin at Holm's first step (level 2.5% / 2), y's only at the full 2.5%
    x, y = _item_means(0.0125, above=False), _item_means(0.025, above=False)
    assert _upper_bound(x, 0.0125) < MAX_KL < _upper_bound(y, 0.0125) and _upper_bound(y, 0.025) < MAX_KL
    rows = _fidelity_rows({"x": x, "y": y})
    expected = holm([_p_by_hand(x), _p_by_hand(y)])
    assert _verdict(rows, "x").p_adjusted == pytest.approx(expected[0], rel=1e-6)
    assert _verdict(rows, "y").p_adjusted == pytest.approx(expected[1], rel=1e-6)
    assert _verdict(rows, "x").accepted and _verdict(rows, "y").accepted
    # x just misses the first step: neither passes (step-down stops there), though y alone would
    x = _item_means(0.0125, above=True)
    rows = _fidelity_rows({"x": x, "y": y})
    assert not _verdict(rows, "x").accepted and not _verdict(rows, "y").accepted
    assert _verdict(rows, "y").p_adjusted == pytest.approx(holm([_p_by_hand(x), _p_by_hand(y)])[1], rel=1e-6)
    assert _verdict(_fidelity_rows({"y": y}), "y").accepted


def test_agreement_margin_adds_to_the_kl_margin():
    means = _item_means(0.025, above=False)
    rows = _rows("baseline", [1.0] * N) + [
        _row("x", i, 1.0, extra={"fidelity": Fidelity((m, m), (True, i % 2 == 0)).to_dict()})
        for i, m in enumerate(means)]
    assert _verdict(rows, "x").accepted  # agreement 80% (3 items of 5 whole, 2 half): no margin on it
    verdict = _verdict(rows, "x", Margins(max_kl=MAX_KL, min_agreement=0.9))
    assert verdict.accepted is False and "top-1 agreement above 90%" in verdict.reason


def test_accuracy_shown_to_drop_rejects_despite_fidelity():
    rows = _rows("baseline", [1.0] * 40) + _rows("x", [0.0] * 40, physical=250, item_kl=[0.005, 0.006, 0.004] * 13
                                                 + [0.005])
    paired = PairedScores.of([1.0] * 40, [0.0] * 40)
    assert paired.interval()[1] < -0.05  # wholly below -max_drop
    verdict = _verdict(rows, "x")
    assert verdict.accepted is False and verdict.criterion == ACCURACY
    assert "fidelity certified" in verdict.reason and "shown to drop by more than 0.05:" in verdict.reason


def test_baseline_at_zero_is_judged_by_fidelity_alone():
    low_kl = [0.005, 0.006, 0.004, 0.005, 0.005]
    rows = _rows("baseline", [0.0] * N) + _rows("x", [0.0] * N, item_kl=low_kl) + _rows(
        "y", [0.0] * N, physical=500, item_kl=[0.5, 0.6, 0.4, 0.5, 0.5])
    x, y = _verdict(rows, "x"), _verdict(rows, "y")
    assert (x.accepted, x.criterion) == (True, FIDELITY) and (y.accepted, y.criterion) == (False, FIDELITY)
    assert "accuracy cannot judge it" in x.reason and "chance floor (0.00)" in x.reason
    # without fidelity, the task cannot judge at all
    bare = _rows("baseline", [0.0] * N) + _rows("x", [0.0] * N)
    verdict = _verdict(bare, "x")
    assert (verdict.accepted, verdict.criterion) == (None, NEITHER)
    assert "does not enter the decision" in verdict.reason and "fidelity was not measured" in verdict.reason


def test_shortcut_floor_hands_certifying_to_fidelity_but_a_shown_drop_still_rejects():
    # the baseline is right on 12 of 20, as often as answering with the first number: accuracy cannot
    # certify a config there, fidelity can ...
    scores = [1.0] * 12 + [0.0] * 8
    rows = [_row("baseline", i, s, extra={"shortcuts": {"first_number": s}}) for i, s in enumerate(scores)]
    rows += _rows("x", scores, physical=250, item_kl=[0.005, 0.006, 0.004, 0.005] * 5)
    verdict = _verdict(rows, "x")
    assert (verdict.accepted, verdict.criterion) == (True, FIDELITY)
    assert "chance floor (0.60)" in verdict.reason
    summary = _by_name(rows, Margins(max_kl=MAX_KL))["x"]
    assert summary.non_inferior is True and summary.decided_by == "passkey: fidelity"
    # ... but a config that scores below the floor is shown to lose more than the margin: rejected,
    # with fidelity certified, and without any fidelity as well
    worse = rows[:20] + _rows("x", [0.0] * 20, physical=250, item_kl=[0.005, 0.006, 0.004, 0.005] * 5)
    assert PairedScores.of(scores, [0.0] * 20).interval()[1] < -0.05
    rejected = _verdict(worse, "x")
    assert (rejected.accepted, rejected.criterion) == (False, ACCURACY) and "fidelity certified" in rejected.reason
    bare = rows[:20] + _rows("x", [0.0] * 20, physical=250)
    assert _verdict(bare, "x").accepted is False and "shown to drop" in _verdict(bare, "x").reason


def test_without_a_fidelity_margin_accuracy_decides_as_before():
    # a config far from the baseline in KL, but right wherever the baseline is, on enough items
    rows = _rows("baseline", [1.0] * 200) + _rows("x", [1.0] * 200, physical=250, item_kl=[2.0] * 200)
    off = Margins(max_kl=0.0)
    verdict = _verdict(rows, "x", off)
    expected = PairedScores.of([1.0] * 200, [1.0] * 200).p_noninferior(0.05)
    assert (verdict.accepted, verdict.criterion) == (True, ACCURACY)
    assert verdict.p_adjusted == pytest.approx(expected) and "fidelity" not in verdict.reason
    assert _verdict(rows, "x").accepted is False  # the default KL margin rejects it
    decision = decide(summarize(rows, margins=off))
    assert decision.sweet_spot.config_name == "x"
    assert decision.rule == RULE.format(margin="0.05", m=1) + ", on every task"


def test_backend_without_fidelity_falls_back_to_accuracy():
    rows = _rows("baseline", [1.0] * 200) + _rows("x", [1.0] * 200, physical=250)
    verdict = _verdict(rows, "x")  # the default margins: a KL margin is set, but nothing measured it
    assert (verdict.accepted, verdict.criterion) == (True, ACCURACY)
    assert verdict.reason.endswith("results stored before kvlab measured it)")
    decision = decide(summarize(rows, margins=Margins()))
    assert decision.sweet_spot.config_name == "x"
    assert "fidelity was not measured" in decision.rule
    assert decision.rule.startswith(RULE.format(margin="0.05", m=1))
