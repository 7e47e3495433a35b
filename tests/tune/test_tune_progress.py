"""kvlab.tune.progress against numbers worked out by hand (the tune page and the CLI show these)."""

from __future__ import annotations

import dataclasses

import pytest

from kvlab.core.tune_spec import TuneSpec
from kvlab.core.units import MIB
from kvlab.store.records import CandidateRecord, TrialRecord
from kvlab.tune import progress
from kvlab.tune.progress import Point

MAX_DROP = 0.1


def point(kv: float, accuracy: float, feasible: bool = True, state: str = "complete", label: str = "") -> Point:
    return Point(trial_id=0, label=label or f"{kv:g}", number=0, state=state, reason=None, rung=0, judged_items=10,
                 accuracy=accuracy, diff=0.0, diff_low=-0.05, diff_high=0.05, kv_bytes=kv, ttft_ms=None, tpot_ms=None,
                 feasible=feasible)


def candidate(trial_id: int, state: str, diff_low: float | None, kv: float | None = 1.0e6,
              accuracy: float | None = 0.9) -> CandidateRecord:
    return CandidateRecord(trial_id=trial_id, experiment_id=1, number=trial_id - 2 if trial_id > 1 else None, rung=0,
                           state=state, reason=None, judged_items=10, accuracy=accuracy, diff=0.0, diff_low=diff_low,
                           diff_high=0.1, kv_bytes=kv, ttft_ms=None, tpot_ms=None, judged_at=None)


def trial(trial_id: int, position: int, items_done: int) -> TrialRecord:
    return TrialRecord(id=trial_id, experiment_id=1, position=position, config_name=f"c{trial_id}", config={},
                       status="done", worker_id=None, claimed_at=None, heartbeat_at=None, started_at=None,
                       finished_at=None, attempts=1, error=None, items_total=10, items_done=items_done)


def test_hypervolume_of_three_points_by_hand():
    # reference (10, 0); strips by bytes: [2, 5) under 0.5, [5, 8) under 0.8, [8, 10) under 0.9
    # = 3 * 0.5 + 3 * 0.8 + 2 * 0.9 = 1.5 + 2.4 + 1.8 = 5.7
    assert progress.hypervolume([(5, 0.8), (2, 0.5), (8, 0.9)], (10, 0)) == pytest.approx(5.7)


def test_hypervolume_ignores_dominated_points_and_points_outside_the_reference():
    base = progress.hypervolume([(5, 0.8), (2, 0.5), (8, 0.9)], (10, 0))
    assert progress.hypervolume([(5, 0.8), (2, 0.5), (8, 0.9), (6, 0.7), (12, 1.0), (1, 0.0)], (10, 0)) == base
    assert progress.hypervolume([], (10, 0)) == 0.0
    assert progress.hypervolume([(4, 0.5)], (10, 0.2)) == pytest.approx(6 * 0.3)  # accuracy measured from 0.2


def test_hypervolume_history_counts_feasible_points_in_trial_order():
    shown = [point(5, 0.8), point(2, 0.5, feasible=False, state="stopped"), point(8, 0.9), point(2, 0.5)]
    # reference (10, 0), box 10 x 1.  After 1: [5, 10) x 0.8 = 4.0 -> 0.40
    # after 2: the stopped one does not count -> 0.40
    # after 3: [5, 8) x 0.8 + [8, 10) x 0.9 = 2.4 + 1.8 = 4.2 -> 0.42
    # after 4: + [2, 5) x 0.5 = 1.5 -> 5.7 -> 0.57
    assert progress.hypervolume_history(shown, 10) == pytest.approx([0.40, 0.40, 0.42, 0.57])


def test_pareto_front_keeps_feasible_non_dominated_points_smallest_first():
    a, b, c = point(5, 0.8, label="a"), point(2, 0.5, label="b"), point(8, 0.9, label="c")
    dominated, infeasible = point(6, 0.7, label="dominated"), point(1, 1.0, feasible=False, label="infeasible")
    assert [p.label for p in progress.pareto_front([c, dominated, a, infeasible, b])] == ["b", "a", "c"]
    assert progress.best_so_far([c, dominated, a, infeasible, b]).label == "b"
    assert progress.best_so_far([infeasible]) is None


def test_feasible_means_complete_and_interval_above_minus_max_drop():
    assert progress.is_feasible(candidate(2, "complete", -0.09), MAX_DROP)
    assert not progress.is_feasible(candidate(2, "complete", -0.1), MAX_DROP)  # on the margin: not shown non-inferior
    assert not progress.is_feasible(candidate(2, "stopped", 0.0), MAX_DROP)
    assert not progress.is_feasible(candidate(2, "active", 0.0), MAX_DROP)
    assert not progress.is_feasible(candidate(2, "complete", None), MAX_DROP)


def test_points_leave_out_the_baseline_and_rows_say_why():
    trials = [trial(1, 0, 20), trial(2, 1, 20), trial(3, 2, 4)]
    cands = [candidate(3, "stopped", -0.9, kv=2.5e6, accuracy=0.25), candidate(1, "active", None, None, None),
             candidate(2, "complete", -0.05, kv=1.5 * MIB)]
    cands[0] = dataclasses.replace(cands[0], reason="clearly inferior after 4 items", judged_items=4, diff=-0.7,
                                   diff_high=-0.2)
    shown = progress.points(cands, trials, MAX_DROP)
    assert [(p.label, p.feasible) for p in shown] == [("c2", True), ("c3", False)]
    rows = progress.candidate_rows(shown)
    assert rows[0] == {"label": "c2", "trial": 0, "state": "complete", "rung/items": "0/10", "accuracy": "0.900",
                            "diff [low, high]": "+0.000 [-0.050, +0.100]", "KV (MiB)": "1.500", "feasible": "yes",
                            "reason": "judged on every item"}
    assert rows[1]["reason"] == "clearly inferior after 4 items"
    assert rows[1]["diff [low, high]"] == "-0.700 [-0.900, -0.200]" and rows[1]["rung/items"] == "0/4"
    assert progress.item_evals(trials) == 44
    assert progress.counts(shown) == {"active": 0, "stopped": 1, "complete": 1, progress.UNFINISHED: 0}


def test_baseline_measures_average_bytes_and_score_an_error_zero():
    from tests.dashboard_data import item_result

    results = [item_result("baseline", i, 256, 0.5) for i in range(3)]
    results[2] = dataclasses.replace(results[2], error="boom")
    kv, accuracy = progress.baseline_measures(results)
    assert kv == 2 * 30 * 3 * 64 * 256 * 2 and accuracy == pytest.approx(2 / 3)
    assert progress.baseline_measures([]) == (None, None)


def _proposed(states: list[str]) -> list[Point]:
    return [dataclasses.replace(point(1.0, 1.0, state=state), number=n) for n, state in enumerate(states)]


def test_budgets_count_the_samplers_trials_against_max_trials_or_the_space():
    shown = _proposed(["complete", "stopped", "active"]) + [dataclasses.replace(point(1.0, 1.0), number=None)]
    state = progress.budgets(shown, TuneSpec(max_trials=40), grid_points=11, elapsed_s=90.0, used=50)
    # a fixed [[configs]] entry (number None) is no trial of the sampler's; 40 asked of a space of 11: 11
    assert (state.done, state.active, state.most, state.max_trials) == (2, 1, 11, 40)
    assert state.pace_s == 45.0
    assert progress.budgets(shown, TuneSpec(max_trials=None, max_minutes=5), 11, 90.0, 50).most is None


@pytest.mark.parametrize("spec, elapsed_s, used, expected", [
    # 3 ended in 300 s: 100 s per trial; 4 - 3 left -> 100 s
    ({"max_trials": 4}, 300.0, 60, progress.Estimate(100.0, "trials")),
    # the time budget runs out first: 10 min - 300 s = 300 s, before the 5 trials left x 100 s
    ({"max_trials": 8, "max_minutes": 10}, 300.0, 60, progress.Estimate(300.0, "minutes")),
    # 60 evaluations in 300 s: 5 s each; 20 left -> 100 s, before the trials' 500 s
    ({"max_trials": 8, "max_item_evals": 80}, 300.0, 60, progress.Estimate(100.0, "item_evals")),
])
def test_eta_is_the_first_budget_to_run_out_at_the_tunes_own_pace(spec, elapsed_s, used, expected):
    state = progress.budgets(_proposed(["complete", "stopped", "complete"]), TuneSpec(**spec), 11, elapsed_s, used)
    assert progress.eta(state) == expected


def test_eta_is_not_known_before_a_trial_ends_unless_a_time_budget_bounds_it():
    running = _proposed(["active", "active"])
    assert progress.eta(progress.budgets(running, TuneSpec(max_trials=4), 11, 120.0, 8)) is None
    assert progress.eta(progress.budgets(running, TuneSpec(max_trials=4, max_minutes=3), 11, 120.0, 8)) == \
        progress.Estimate(60.0, "minutes")
