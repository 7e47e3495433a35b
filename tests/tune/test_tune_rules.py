"""`kvlab tune`'s rules without a model: the space, the rounds, the verdicts and the recommendation.

Every expected value is worked out by hand in the comments, not with kvlab's helpers.
"""

from __future__ import annotations

import shlex
import tomllib

import pytest

from kvlab.analysis.decision import PairedScores
from kvlab.cli.main import build_parser
from kvlab.cli.serve import kv_config_from_args
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.margins import Margins
from kvlab.core.tune_spec import TuneSpec, backend_space, candidate_grid, rungs
from kvlab.store.tunes import optuna_schema
from kvlab.tune.judge import Evidence, Limits, judge, leftover_reason
from kvlab.tune.recommend import config_toml, engine_flag, serve_command
from kvlab.tune.study import initial_design

TASKS = [{"name": "passkey", "context_lengths": [512], "num_items": 4}]


def spec_with(tune: dict, backend: str = "embedded") -> object:
    return parse_spec({"tasks": TASKS, "tune": tune, "backend": {"kind": backend}})


# -- the space ---------------------------------------------------------------------------------------

def test_grid_counts_the_conditional_space():
    tune = TuneSpec(quant=["none", "int4", "fp8_e4m3"], group_sizes=[32, 128], evict=["none", "snapkv"],
                    budget_range=(0.5, 0.75), budget_step=0.125)
    # formats: none (1) + int4 x 2 group sizes (2) + fp8 x 2 group sizes (2: its blocks) = 5 quant parts
    # eviction: none (1) + snapkv x budgets 0.5, 0.625, 0.75 (3) = 4 parts; 5 x 4 = 20, less the baseline
    assert tune.budgets() == [0.5, 0.625, 0.75]
    grid = candidate_grid(tune)
    assert len(grid) == 19
    assert {"quant": "int4", "group_size": 32, "residual_length": 64} in grid
    assert {"quant": "fp8_e4m3", "group_size": 128, "residual_length": 64} in grid
    assert {"evict": "snapkv", "ratio": 0.625} in grid
    assert len({KVCacheConfig(**point).label for point in grid}) == 19  # a tune tells candidates apart by label
    assert all(KVCacheConfig(**point).label != "baseline" for point in grid)


@pytest.mark.parametrize(("tune", "message"), [
    ({"quant": ["none"], "evict": ["none"]}, "only the baseline"),
    ({"budget_range": [0.9, 0.5]}, "need 0 < low <= high < 1"),
    ({"max_trials": None}, "give the search a budget"),
    ({"evict": ["streaming_llm"], "budget": "threshold"}, "tune.budget: Input should be 'ratio' or 'keep_fraction'"),
    ({"quant": ["int4", "int4"]}, "lists int4 twice"),
    ({"quant": ["int5"]}, "tune.quant.0"),
])
def test_bad_tune_tables_are_refused_with_the_field(tune, message):
    with pytest.raises(ConfigError, match=message):
        spec_with(tune)


def test_backend_space_keeps_what_the_engine_has():
    tune = TuneSpec(quant=["none", "int8", "int4", "fp8_e4m3", "fp8_e5m2"], evict=["none", "snapkv"])
    narrowed, notes = backend_space(tune, "vllm")
    assert narrowed.quant == ["none", "fp8_e4m3", "fp8_e5m2"] and narrowed.evict == ["none"]
    assert any("int8, int4" in note for note in notes) and any("evicts no tokens" in note for note in notes)
    assert backend_space(tune, "embedded") == (tune, [])
    with pytest.raises(ConfigError, match="nothing kvlab can tune"):
        spec_with({"quant": ["int8"]}, backend="openai_compat")
    with pytest.raises(ConfigError, match="nothing left to tune on sglang"):
        spec_with({"quant": ["int4"], "evict": ["none", "snapkv"]}, backend="sglang")


def test_initial_design_walks_the_axes():
    tune = TuneSpec(quant=["none", "int8", "fp8_e4m3"], group_sizes=[128, 32], evict=["none", "tova"],
                    budget_range=(0.25, 0.75), budget_step=0.25)
    assert initial_design(tune) == [
        {"quant": "int8", "evict": "none", "group_size": 128, "residual_length": 64},
        {"quant": "fp8_e4m3", "evict": "none", "group_size": 128, "residual_length": 64},  # fp8 reads both too
        {"quant": "none", "evict": "tova", "budget": 0.5},  # budgets 0.25, 0.5, 0.75: the middle one
    ]


def test_optuna_schema_sits_beside_the_store_schema():
    from sqlalchemy import make_url

    assert optuna_schema(make_url("postgresql+psycopg://u:p@h/db")) == "kvlab_optuna"
    assert optuna_schema(make_url("postgresql+psycopg://u:p@h/db?options=-csearch_path%3Dteam_a")) == "team_a_optuna"


# -- rounds and verdicts -------------------------------------------------------------------------------

def test_rungs():
    assert rungs(20, 4, 3) == [4, 7, 20]  # 20 / 3 -> 7, 7 / 3 -> 3, raised to the minimum 4
    assert rungs(40, 4, 3) == [4, 14, 40]  # 40 -> 14 -> 5 -> 4: 5 is under 1.5 x 4, dropped
    assert rungs(3, 4, 3) == [3]


def evidence(trial_id: int, rung: int, n: int, config_mean: float, kv_mb: float, base_mean: float = 1.0,
             ttft_ms: float | None = None) -> Evidence:
    return Evidence(trial_id, f"c{trial_id}", rung, n, PairedScores(config_mean, base_mean, n, 0.0), kv_mb * 1e6,
                    ttft_ms, None)


def test_a_clear_loser_stops_after_the_first_rung():
    # 0/8 against the baseline's 8/8: Wilson upper end of 0/8 is 3.84 / 11.84 = 0.324 and the lower end of
    # 8/8 is 8 / 11.84 = 0.676, so the difference's interval ends near -1 + sqrt(0.324^2 + 0.324^2) = -0.54,
    # below -0.05: it stops.  7/8 (difference -0.125) is not clear yet.
    loser, unsure = evidence(1, 0, 8, 0.0, 1.0), evidence(2, 0, 8, 7 / 8, 2.0)
    verdicts = judge([loser, unsure], {0: [loser, unsure]}, None, 2, Limits(0.05), eta=3, exploring=True)
    assert verdicts[1].state == "stopped" and "clearly inferior after 8 items" in verdicts[1].reason
    assert 2 not in verdicts  # it waits: 2 reached rung 0, 2 // 3 = 0 promotions yet


def test_asha_promotes_the_most_compressed_plausible_third():
    # Six candidates reached rung 0: 6 // 3 = 2 promotions.  Plausible (difference above -0.3): ids 1-5
    # (id 4: 0.75 - 1 = -0.25); by bytes the smallest plausible are 2 (1 MB) and 4 (2 MB); id 6 (0.5 MB) is
    # implausible (-0.5).
    cands = [evidence(1, 0, 4, 1.0, 3.0), evidence(2, 0, 4, 1.0, 1.0), evidence(3, 0, 4, 1.0, 4.0),
             evidence(4, 0, 4, 0.75, 2.0), evidence(5, 0, 4, 1.0, 5.0), evidence(6, 0, 4, 0.5, 0.5)]
    verdicts = judge(cands, {0: cands}, None, 2, Limits(0.3), eta=3, exploring=True)
    assert {i for i, v in verdicts.items() if v.promote_to == 1} == {2, 4}
    # once the sampler is done, one per rung and round: the most compressed plausible one left (id 1, 3 MB)
    rest = [c for c in cands if c.trial_id not in (2, 4)]
    verdicts = judge(rest, {0: cands}, None, 2, Limits(0.3), eta=3, exploring=False)
    assert {i for i, v in verdicts.items() if v.promote_to == 1} == {1}
    assert "not promoted" in leftover_reason(cands[5], 3, 0.2) and "-0.500" in leftover_reason(cands[5], 3, 0.2)


def test_dominated_and_latency_stops():
    # The best: shown non-inferior on all 100 items (100/100 both: interval lower end -0.037 > -0.05)
    best = evidence(1, 2, 100, 1.0, 1.0)
    assert best.non_inferior(0.05)
    bigger, smaller = evidence(2, 0, 4, 1.0, 1.5), evidence(3, 0, 4, 1.0, 0.8, ttft_ms=900.0)
    verdicts = judge([bigger, smaller], {0: [best, bigger, smaller]}, best, 2,
                     Limits(0.05, max_ttft_ms=500.0), eta=3, exploring=True)
    assert verdicts[2].state == "stopped" and verdicts[2].reason.startswith("dominated: no smaller than c1")
    assert verdicts[3].state == "stopped" and "median TTFT 900 ms over the limit of 500 ms" in verdicts[3].reason


def test_last_rung_completes():
    done = evidence(1, 2, 20, 1.0, 1.0)
    assert judge([done], {0: [done], 1: [done], 2: [done]}, None, 2, Limits(0.25), eta=3,
                 exploring=True)[1].state == "complete"


# -- the recommendation ---------------------------------------------------------------------------------

def test_serve_command_and_engine_flags():
    int4 = KVCacheConfig(quant="int4", group_size=32, residual_length=128)
    assert serve_command("smollm2-135m", int4) == (
        "kvlab serve --model smollm2-135m --quant int4 --group-size 32 --residual-length 128")
    fp8 = KVCacheConfig(quant="fp8_e4m3")
    assert engine_flag("vllm", fp8) == {"flag": "--kv-cache-dtype fp8_e4m3",
                                        "statement": "launch vLLM with --kv-cache-dtype fp8_e4m3"}
    assert engine_flag("sglang", fp8)["flag"] == "--kv-cache-dtype fp8_e4m3"
    vllm_int4 = engine_flag("vllm", int4)
    assert vllm_int4["flag"] is None and vllm_int4["statement"].startswith("vLLM has no equivalent of int4")
    snap = KVCacheConfig(quant="fp8_e5m2", evict="snapkv", ratio=0.75, window_size=32)
    assert serve_command("m", snap) == ("kvlab serve --model m --quant fp8_e5m2 --evict snapkv --ratio 0.75 "
                                        "--window-size 32")
    evicting = engine_flag("sglang", snap)
    assert evicting["flag"] is None
    assert evicting["statement"].startswith("SGLang has no equivalent: it evicts no tokens")
    assert "--kv-cache-dtype fp8_e5m2" in evicting["statement"]
    entry = tomllib.loads(config_toml(snap))["configs"][0]
    assert KVCacheConfig(**{k: v for k, v in entry.items() if k != "name"}) == snap
    # kvlab's own rotation is a kvlab serve option, so that a rotated answer deploys rotated
    rotated = KVCacheConfig(quant="int4", rotation=True)
    command = serve_command("m", rotated)
    assert command.endswith("--rotation true")
    assert kv_config_from_args(build_parser().parse_args(shlex.split(command)[1:])) == rotated
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--rotation", "yes"])


def test_early_stopped_candidates_count_in_holms_family():
    """20/20 for the baseline and a config: the paired interval's lower end at quantile z is
    -z^2 / (20 + z^2) (both constant: no correlation; the baseline's upper end is 1), above -0.25 while
    z^2 < 20/3, i.e. z < 2.582: one-sided level above 0.0049 = 0.025 / m for m < 5.09.  So with 4
    early-stopped candidates (m = 5) it is non-inferior, with 5 (m = 6) it is not."""
    from kvlab.analysis.summary import decide, summarize
    from tests.store.test_store import make_result

    results = [make_result(f"passkey-{i}", name, score=1.0, physical_kv_bytes=bytes_, config={"quant": quant})
               for i in range(20) for name, quant, bytes_ in (("baseline", "none", 100), ("int4", "int4", 30))]
    for untested, verdict in ((4, True), (5, False)):
        summaries = summarize(results, "baseline", Margins(max_drop=0.25), untested=untested)
        assert next(s for s in summaries if s.config_name == "int4").non_inferior is verdict
        decision = decide(summaries, "baseline", untested=untested)
        assert f"across {untested + 1} configs" in decision.rule
        assert (decision.sweet_spot is not None) is verdict
