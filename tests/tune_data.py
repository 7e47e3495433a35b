"""A synthetic ``kvlab tune`` in the store, written through the Store API the way the tune's driver and
workers write it (no model): a baseline and four candidates over two rounds (4 items, then 20), two
of them stopped early, and -- finished -- the recommendation built by kvlab.tune.recommend from the
same results; beside the store, its Optuna study with each candidate's trial, as the sampler asked it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna

from kvlab.analysis.decision import PairedScores
from kvlab.analysis.summary import decide, summarize
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.margins import Margins
from kvlab.core.results import ItemResult
from kvlab.core.space import BUDGET_PARAM
from kvlab.core.tune_spec import backend_space, candidate_grid
from kvlab.store import Store
from kvlab.store.tunes import study_name
from kvlab.tune import study as studies
from kvlab.tune.recommend import recommendation

N_ITEMS, FIRST_ROUND = 20, 4
MAX_DROP = 0.25
SPEC = {"name": "synthetic-tune", "max_drop": MAX_DROP,
        "tasks": [{"name": "passkey", "context_lengths": [256], "depths": [0.5], "num_items": N_ITEMS}],
        "tune": {"quant": ["none", "int8", "int4", "int2"], "evict": ["none", "snapkv"], "budget_range": [0.5, 0.75],
                 "budget_step": 0.25, "min_items": FIRST_ROUND, "eta": 4, "max_trials": 4}}
BASELINE_BYTES = 2 * 30 * 3 * 64 * 256 * 2
#: candidate -> (config, bytes per baseline byte, the items it gets wrong)
CANDIDATES = {
    "int8": (KVCacheConfig(quant="int8"), 0.52, ()),
    "int4": (KVCacheConfig(quant="int4"), 0.27, (5,)),
    "int2": (KVCacheConfig(quant="int2"), 0.15, tuple(range(N_ITEMS))),
    "snapkv": (KVCacheConfig(evict="snapkv", ratio=0.5), 0.5, (1,)),
}
STOPPED_REASON = {  # kvlab.tune.judge's wording
    "int2": "clearly inferior after 4 items: accuracy difference [{low:+.3f}, {high:+.3f}] lies below -0.25",
    "snapkv": "not promoted: not among the most compressed 1/4 of the plausible candidates after 4 items",
}


def item_result(config: KVCacheConfig, name: str, fraction: float, wrong: tuple[int, ...], item: int) -> ItemResult:
    correct = item not in wrong
    return ItemResult(
        item_id=f"passkey-256-{item}", task="passkey", config_name=config.label, config=config.model_dump(mode="json"),
        seed=0, context_length=256, depth=0.5, prompt_tokens=256, context_tokens=236, kept_tokens=256.0,
        kept_fraction=1.0, baseline_kv_bytes=BASELINE_BYTES, physical_kv_bytes=int(BASELINE_BYTES * fraction),
        analytic_kv_bytes=int(BASELINE_BYTES * fraction), compression_ratio=1 / fraction,
        peak_kv_bytes=BASELINE_BYTES, generated=" 12345." if correct else " 99999.", answer="12345", output_tokens=4,
        ttft_s=0.1 + (0.02 if name == "snapkv" else 0.0), tpot_s=0.05, prefill_s=0.09, compress_s=0.005,
        decode_s=0.15, peak_memory_bytes=None, score=1.0 if correct else 0.0)


def _run(store: Store, experiment_id: int, plan: dict[int, tuple[KVCacheConfig, str, float, tuple[int, ...]]],
         items: range) -> None:
    """Claim the queued trials and write ``items`` of each, as a worker would."""
    for trial in store.claim_trials("test-host:w0", max_trials=10, experiment_id=experiment_id):
        config, name, fraction, wrong = plan[trial.id]
        store.set_items_total(trial.id, N_ITEMS)
        for item in items:
            store.add_item_result(trial.id, item_result(config, name, fraction, wrong, item))
        store.finish_trial(trial.id, "done", worker_id="test-host:w0")


def _verdict(name: str, wrong: tuple[int, ...], fraction: float, n: int) -> dict[str, object]:
    paired = PairedScores.of([1.0] * n, [0.0 if i in wrong else 1.0 for i in range(n)])
    low, high = paired.interval()
    return {"judged_items": n, "accuracy": paired.config_mean, "diff": paired.difference, "diff_low": low,
            "diff_high": high, "kv_bytes": BASELINE_BYTES * fraction, "ttft_ms": 100.0, "tpot_ms": 50.0}


def _propose(store: Store, experiment_id: int, names: Sequence[str]) -> tuple[optuna.Study, dict[str, int]]:
    """The tune's Optuna study, beside the store as the driver keeps it, with one trial per candidate
    asked as the driver asks it (each candidate's format and method enqueued, the rest the space's own
    questions): its parameters are the sampler's, checked to name the candidate's config.  Returns the
    study and each candidate's trial number."""
    spec = parse_spec(SPEC)
    assert spec.tune is not None
    tune, _ = backend_space(spec.tune, spec.backend.kind)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=study_name(experiment_id), storage=store.study_storage_url(),
                                directions=list(studies.DIRECTIONS), sampler=optuna.samplers.TPESampler(seed=0))
    numbers = {}
    for name in names:
        config = CANDIDATES[name][0]
        study.enqueue_trial({"quant": config.quant, "evict": config.evict}
                            | ({BUDGET_PARAM: config.ratio} if config.evict != "none" else {}))
        trial = study.ask()
        assert studies.suggest_config(trial, tune).label == config.label, (name, trial.params)
        numbers[name] = trial.number
    return study, numbers


def _tell(study: optuna.Study, number: int, verdict: dict[str, Any]) -> None:
    """Report an ended candidate to the study, as the driver does: feasible when its interval lies above -max_drop."""
    studies.tell(study, number, verdict["kv_bytes"], verdict["accuracy"], {"rule": -(verdict["diff_low"] + MAX_DROP)})


def populate_tune(store: Store, finish: bool = True, names: Sequence[str] = tuple(CANDIDATES)) -> int:
    """The tune's experiment id.  ``names``: the candidates proposed (of :data:`CANDIDATES`, in its
    order).  ``finish=False`` leaves it running: int8 and int4 promoted and complete, int2 stopped,
    snapkv still active (waiting) after the first round."""
    spec = parse_spec(SPEC)
    experiment_id = store.create_experiment(spec, {"versions": {"kvlab": "test"}, "git_commit": "abc123",
                                                   "hardware": {"cpu_count": 2}}, item_limit=FIRST_ROUND)
    grid_points = len(candidate_grid(spec.tune))
    store.start_tune(experiment_id, grid_points, (grid_points + 1) * N_ITEMS,
                     "test-host-1-driver")
    baseline = store.trials(experiment_id)[0]
    store.track_trial(experiment_id, baseline.id)
    study, numbers = _propose(store, experiment_id, names)
    ids = store.add_candidates(experiment_id, [(CANDIDATES[n][0], numbers[n]) for n in names], FIRST_ROUND)
    by_name = dict(zip(names, ids, strict=True))
    for name, trial_id in by_name.items():
        study._storage.set_trial_user_attr(study._storage.get_trial_id_from_study_id_trial_number(
            study._study_id, numbers[name]), "kvlab_trial_id", trial_id)
    plan = {baseline.id: (KVCacheConfig(), "baseline", 1.0, ())}
    plan |= {by_name[name]: (CANDIDATES[name][0], name, CANDIDATES[name][1], CANDIDATES[name][2]) for name in names}
    _run(store, experiment_id, plan, range(FIRST_ROUND))
    for name in names:
        _, fraction, wrong = CANDIDATES[name]
        store.judge_candidate(by_name[name], rung=0, **_verdict(name, wrong, fraction, FIRST_ROUND))
    if "int2" in by_name:
        int2 = _verdict("int2", CANDIDATES["int2"][2], CANDIDATES["int2"][1], FIRST_ROUND)
        store.judge_candidate(by_name["int2"], state="stopped", reason=STOPPED_REASON["int2"].format(
            low=int2["diff_low"], high=int2["diff_high"]))
        _tell(study, numbers["int2"], int2)
    promoted = [name for name in ("int8", "int4") if name in by_name]
    store.extend_trials([baseline.id], N_ITEMS)
    store.extend_trials([by_name[name] for name in promoted], N_ITEMS, rung=1)
    _run(store, experiment_id, plan, range(FIRST_ROUND, N_ITEMS))
    for name in promoted:
        _, fraction, wrong = CANDIDATES[name]
        verdict = _verdict(name, wrong, fraction, N_ITEMS)
        store.judge_candidate(by_name[name], state="complete", rung=1, **verdict)
        _tell(study, numbers[name], verdict)
    if not finish:
        return experiment_id
    if "snapkv" in by_name:
        store.judge_candidate(by_name["snapkv"], state="stopped", reason=STOPPED_REASON["snapkv"])
        _tell(study, numbers["snapkv"], _verdict("snapkv", CANDIDATES["snapkv"][2], CANDIDATES["snapkv"][1],
                                                 FIRST_ROUND))
    trials = store.trials(experiment_id)
    kept = {baseline.config_name} | {CANDIDATES[name][0].label for name in promoted}
    results = [r for r in store.item_results(experiment_id) if r.config_name in kept]
    summaries = summarize(results, baseline.config_name, Margins(max_drop=MAX_DROP))
    base_summary = next(s for s in summaries if s.config_name == baseline.config_name)
    answer = recommendation("smollm2-135m", decide(summaries, baseline.config_name),
                            [s for s in summaries if s is not base_summary], base_summary)
    used = sum(t.items_done for t in trials)
    answer |= {"item_evals": used, "grid_item_evals": (grid_points + 1) * N_ITEMS,
               "stopped_because": f"max_trials = {len(names)} candidates proposed"}
    store.finish_tune(experiment_id, "done", answer, f"{used} item evaluations")
    return experiment_id
