"""``kvlab tune`` with a ``[load]`` table and its target: each candidate's server is measured under the load once it
runs every item (the last rung), and one that misses the target stops there -- the target is a constraint of the
search, as the latency limits are -- so the recommendation is the most compressed acceptable candidate whose server
held it, with what it buys under the load.

The driver is kvlab's own (:class:`kvlab.tune.driver.Tuner`); its executor writes items and load levels as a worker
would (synthetic results: no model, no server)."""

from __future__ import annotations

from collections.abc import Callable

import optuna
import pytest

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tune_spec import candidate_grid
from kvlab.load.metrics import LevelResult, ServerReading
from kvlab.store import Store
from kvlab.store.tunes import study_name
from kvlab.tune.driver import Tuner
from kvlab.tune.recommend import describe
from tests.tune_data import N_ITEMS, item_result

WORKER = "test-host:w0"
CLIENTS = 4
#: config label -> (bytes per baseline byte, requests its pool runs at once at 4 clients); every config answers
#: every item right, each running request streams 10 tokens/s: q4_0 is the smallest but its server (say, slower
#: kernels) runs only 2 at once; q8_0 runs 4.
OUTCOMES = {KVCacheConfig().label: (1.0, 2), KVCacheConfig(quant="q8_0").label: (0.53, 4),
            KVCacheConfig(quant="q4_0").label: (0.28, 2)}
TARGET = {"clients": CLIENTS, "min_output_tokens_per_s": 30.0}
SPEC = {"name": "tune-under-load", "max_drop": 0.25, "backend": {"kind": "llamacpp"},
        "tasks": [{"name": "passkey", "context_lengths": [256], "depths": [0.5], "num_items": N_ITEMS}],
        "tune": {"quant": ["q8_0", "q4_0"], "min_items": 4, "eta": 4, "max_trials": 2},
        "load": {"kv_budget_mib": 28, "concurrency": [1, CLIENTS], "requests": 8, "target": TARGET}}


def level(clients: int, running: int) -> LevelResult:
    latency = {"ttft": {"mean": 100.0, "p50": 100.0, "p90": 150.0, "p99": 200.0}, "tpot": None, "itl": None,
               "e2el": None}
    return LevelResult("closed", float(clients), 8, 8, 0, None, 10.0, 0.8, 10.0 * running, 100.0, 2048, 128, latency,
                       ServerReading(running, clients - running, 0, 1.0, 10), 1_280)


class Worker:
    """Runs every queued trial to its item limit, as a worker would; a trial that reached every item then runs
    the load levels (:meth:`kvlab.experiments.worker.Worker._evaluate`'s rule), which this records."""

    def __init__(self, store: Store) -> None:
        self.store, self.loaded = store, []

    def drain(self, experiment_id: int, stopping: Callable[[], bool]) -> None:
        for trial in self.store.claim_trials(WORKER, max_trials=100, experiment_id=experiment_id):
            config = KVCacheConfig(**trial.config)
            fraction, running = OUTCOMES[config.label]
            limit = min(trial.item_limit or N_ITEMS, N_ITEMS)
            self.store.set_items_total(trial.id, limit)
            for item in range(trial.items_done, limit):
                self.store.add_item_result(trial.id, item_result(config, trial.config_name, fraction, (), item))
            if limit == N_ITEMS:
                self.loaded.append(trial.config_name)
                for clients in (1, CLIENTS):
                    self.store.add_load_level(trial.id, "closed", float(clients),
                                              level(clients, min(clients, running)).to_dict())
            self.store.finish_trial(trial.id, "done", worker_id=WORKER)


def test_a_candidate_whose_server_misses_the_load_target_stops_and_the_answer_holds_it(tmp_path):
    spec = parse_spec(SPEC)
    assert spec.tune is not None and spec.load is not None
    items = [TaskItem(task="passkey", item_id=f"passkey-256-{i}", context="", question="", answer="12345",
                      context_length=256, depth=0.5, max_new_tokens=4) for i in range(N_ITEMS)]
    said: list[str] = []
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        experiment_id = store.create_experiment(spec, {}, item_limit=spec.tune.min_items)
        points = len(candidate_grid(spec.tune))
        store.start_tune(experiment_id, points, (points + 1) * N_ITEMS, "test-driver")
        worker = Worker(store)
        answer = Tuner(store, experiment_id, spec, items, worker, "test-driver", say=said.append).run()
        names = {t.id: t.config_name for t in store.trials(experiment_id)}
        candidates = {names[c.trial_id]: c for c in store.candidates(experiment_id)}
        study = optuna.load_study(study_name=study_name(experiment_id), storage=store.study_storage_url())

    # only servers that ran every item were put under load: no candidate's first rung paid for a load phase
    assert sorted(worker.loaded) == ["baseline", "q4_0", "q8_0"]
    assert candidates["q4_0"].state == "stopped"
    assert candidates["q4_0"].reason == "its server missed the load target (20.0 output tokens/s)"
    assert candidates["q8_0"].state == "complete"
    told = {names[t.user_attrs["kvlab_trial_id"]]: {key.rsplit(":", 1)[-1]: value for key, value
                                                       in t.system_attrs.items() if key.startswith("constraints")}
            for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert {name: constraints["load"] for name, constraints in told.items()} == {"q4_0": 1.0, "q8_0": 0.0}

    assert answer["label"] == "q8_0"
    assert answer["load"]["gain"].startswith("q8_0: 1.00x the pool tokens, 2.00x the output tokens/s at 4 clients")
    assert answer["load"]["target_lines"] == [
        "holding the load target (at least 30 output tokens/s at 4 clients): the sweet spot is q8_0",
        "  baseline missed it (20.0 output tokens/s)"]
    printed = "\n".join(describe(answer))
    assert "under load: q8_0: 1.00x the pool tokens" in printed and "the sweet spot is q8_0" in printed
    # llama.cpp's own format: kvlab's cache does not store it, so no `kvlab serve` command is offered to deploy it
    assert answer["kvlab_serve"] is None and "kvlab serve" not in printed
    assert "launch llama.cpp with --cache-type-k q8_0 --cache-type-v q8_0 -fa on" in printed


def test_a_tune_with_a_load_table_needs_what_kvlab_run_needs():
    with pytest.raises(ConfigError, match="kv_budget_mib"):
        parse_spec(SPEC | {"load": {"concurrency": [1]}})
