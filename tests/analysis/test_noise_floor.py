"""The engine's noise floor beside the configs' fidelity: its mean and t interval over the baseline's items (the
estimator and unit of every config's), which configs cannot be told from it, a fidelity margin set inside it, and
the report, the JSON of a run and the tune's answer that carry it (synthetic results: the real servers' floor is
tests/engines/test_llamacpp_real.py's)."""

from __future__ import annotations

import json
import statistics

import pytest

from kvlab.analysis.fidelity import FidelitySummary
from kvlab.analysis.noise_floor import HOW, floor_lines, floor_under_load, noise_floor, under_load_lines
from kvlab.analysis.summary import summarize
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.margins import Margins
from kvlab.core.results import NOISE_FLOOR_KEY, NOISE_FLOOR_NOTE_KEY, TEACHER_BASELINE_SAMPLE, Fidelity, ItemResult
from kvlab.experiments.report import render
from kvlab.load.metrics import LevelResult, ServerReading
from kvlab.store.records import LoadLevelRecord

ITEMS = 6
#: Per item, the baseline against itself: small log-ratios of both signs around 0.003 nats per token.
FLOOR_ITEMS = [(0.004, 0.002), (0.001, 0.003), (0.003, 0.005), (0.006, 0.000), (0.002, 0.002), (0.005, 0.003)]
CONFIGS = {"baseline": KVCacheConfig(), "q8_0": KVCacheConfig(quant="q8_0"), "q4_0": KVCacheConfig(quant="q4_0")}
#: Per config, each item's KL per token: q8_0 about the floor's size, q4_0 ten times it.
KL = {"q8_0": [(0.003, 0.001), (0.002, 0.002), (0.001, 0.003), (0.002, 0.002), (0.003, 0.002), (0.002, 0.001)],
      "q4_0": [(0.03, 0.02), (0.04, 0.03), (0.02, 0.03), (0.03, 0.04), (0.05, 0.02), (0.03, 0.03)]}


def result(name: str, item: int, **extra) -> ItemResult:
    config = CONFIGS[name]
    if name in KL:
        extra["fidelity"] = Fidelity(kl=KL[name][item], agree=(True, True), teacher=TEACHER_BASELINE_SAMPLE).to_dict()
    return ItemResult(
        item_id=f"passkey-512-{item}", task="passkey", config_name=name, config=config.model_dump(mode="json"),
        seed=0, context_length=512, depth=0.5, prompt_tokens=512, context_tokens=500, kept_tokens=512.0,
        kept_fraction=1.0, baseline_kv_bytes=512 * 23_040, physical_kv_bytes=None,
        analytic_kv_bytes=512 * 23_040, compression_ratio=1.0, peak_kv_bytes=None, generated=" 12345.",
        answer="12345", output_tokens=2, ttft_s=0.1, tpot_s=0.05, prefill_s=float("nan"), compress_s=float("nan"),
        decode_s=0.05, peak_memory_bytes=None, score=1.0, extra=extra)


def results(floor_on: int = ITEMS) -> list[ItemResult]:
    rows = []
    for item in range(ITEMS):
        floor = Fidelity(kl=FLOOR_ITEMS[item], agree=(True, True), teacher=TEACHER_BASELINE_SAMPLE)
        extra = ({NOISE_FLOOR_KEY: floor.to_dict()} if item < floor_on else
                 {NOISE_FLOOR_NOTE_KEY: "noise floor not measured (its /generate scoring has no field that skips "
                                        "the prefix cache)"})
        rows.append(result("baseline", item, **extra))
        rows += [result(name, item) for name in KL]
    return rows


def test_the_floor_is_the_baseline_against_itself_with_the_configs_estimator_and_unit():
    rows = results()
    floor = noise_floor(rows, "baseline")
    assert floor is not None and floor.summary.items == ITEMS and floor.summary.tokens == 2 * ITEMS
    expected = FidelitySummary.of([Fidelity(kl=kl, agree=(True, True)) for kl in FLOOR_ITEMS])
    assert floor.mean_kl == pytest.approx(statistics.fmean(sum(kl) / 2 for kl in FLOOR_ITEMS)) == pytest.approx(0.003)
    assert floor.interval == pytest.approx(expected.kl_interval()) and floor.interval[0] < 0.003 < floor.interval[1]
    assert floor.to_dict() == {"items": ITEMS, "tokens": 2 * ITEMS, "mean_kl": pytest.approx(0.003),
                               "kl_ci": list(floor.interval), "how": HOW}
    # the embedded engine (no floor on its results) has none to show
    assert noise_floor([r for r in rows if NOISE_FLOOR_KEY not in r.extra], "baseline") is None


def test_a_config_inside_the_floor_is_indistinguishable_and_a_margin_inside_it_is_warned():
    rows = results()
    floor = noise_floor(rows, "baseline")
    assert floor is not None
    summaries = summarize(rows, "baseline", Margins(max_drop=0.5, max_kl=0.002))
    by_name = {s.config_name: s for s in summaries}
    assert floor.holds(by_name["q8_0"]) and not floor.holds(by_name["q4_0"])
    lines = floor_lines(floor, summaries, "baseline", Margins(max_drop=0.5, max_kl=0.002))
    low, high = floor.interval
    assert lines == [
        f"engine noise floor: mean KL 0.0030 [{low:.4f}, {high:.4f}] nats per token over 6 items ({HOW})",
        "indistinguishable from the engine's own noise (KL interval inside the floor's): q8_0",
        f"warning: max_kl = 0.002 lies inside the engine's noise floor (mean KL 0.0030 [{low:.4f}, {high:.4f}]): at "
        "that margin a config cannot be told from the engine's own noise; raise it above the floor or use a "
        "batch-invariant engine"]
    # a margin above the floor, or none (0), warns of nothing
    assert len(floor_lines(floor, summaries, "baseline", Margins(max_drop=0.5, max_kl=0.05))) == 2
    assert len(floor_lines(floor, summaries, "baseline", Margins(max_drop=0.5, max_kl=0.0))) == 2


def test_the_report_shows_the_floor_and_why_some_items_have_none():
    rows = results(floor_on=ITEMS - 1)
    summaries = summarize(rows, "baseline", Margins(max_drop=0.5, max_kl=0.05))
    text = render(summaries, rows, "baseline")
    (line,) = [line for line in text.splitlines() if line.startswith("engine noise floor:")]
    assert f"over {ITEMS - 1} items" in line
    assert "\nnoise floor not measured (its /generate scoring has no field that skips the prefix cache)\n" in text


#: The baseline's items scored afresh with 4 clients busy beside them: twice the quiet floor.
UNDER_LOAD = [(0.008, 0.004), (0.002, 0.006), (0.006, 0.010), (0.012, 0.000), (0.004, 0.004), (0.010, 0.006)]


def level_record(name: str, level: float, **floor) -> LoadLevelRecord:
    served = LevelResult(mode="closed", level=level, requests=8, completed=8, errors=0, first_error=None,
                         duration_s=2.0, request_throughput=4.0, output_throughput=64.0,
                         total_token_throughput=400.0, prompt_tokens=672, output_tokens=128, latency_ms={},
                         server=ServerReading(), **floor)
    # through JSON, as the store keeps it
    return LoadLevelRecord(trial_id=1, config_name=name, mode="closed", level=level,
                           result=json.loads(json.dumps(served.to_dict())))


def test_the_floor_under_load_is_the_baseline_scored_with_clients_busy_beside_it():
    """The baseline's level of the most clients carries each item's floor scored under that load; the report, the
    run's JSON (:func:`floor_under_load`) and every page read it from the stored level."""
    floors = [Fidelity(kl=kl, agree=(True, True), teacher=TEACHER_BASELINE_SAMPLE).to_dict() for kl in UNDER_LOAD]
    records = [level_record("baseline", 1), level_record("baseline", 4, noise_floor=floors),
               level_record("q8_0", 4)]
    floor = floor_under_load(records, "baseline")
    assert floor is not None and floor.summary.items == ITEMS and floor.mean_kl == pytest.approx(0.006)
    assert floor.to_dict()["how"] == "scored afresh while 4 clients kept the server busy"
    rows = results()
    summaries = summarize(rows, "baseline", Margins(max_drop=0.5, max_kl=0.05))
    text = render(summaries, rows, "baseline", load=records)
    low, high = floor.interval
    assert (f"\nunder load, engine noise floor: mean KL 0.0060 [{low:.4f}, {high:.4f}] nats per token over {ITEMS} "
            "items (scored afresh while 4 clients kept the server busy)\n") in text
    # a server that could not score beside its load says why, once
    why = "noise floor under load not measured (it returns no token ids (return_token_ids))"
    assert under_load_lines([level_record("baseline", 4, noise_floor_note=why)], "baseline") == [why]
    assert floor_under_load([level_record("baseline", 4, noise_floor_note=why)], "baseline") is None
