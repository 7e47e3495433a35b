"""A tune cancelled the way the tune page's Cancel does it -- the store's cancel
(:meth:`Store.cancel_experiment`), while its driver runs and a trial is in flight: the driver proposes
nothing more and ends the tune cancelled, the trial in flight keeps the items it did, the candidates
judged so far keep their verdicts, and the study keeps its finished trials (none left running).

The driver is kvlab's own (:class:`kvlab.tune.driver.Tuner`); its executor writes each round's
results as a worker would (tests/tune_data's synthetic results: no model)."""

from __future__ import annotations

from collections.abc import Callable

import optuna

from kvlab.core.experiment_spec import parse_spec
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tune_spec import candidate_grid
from kvlab.store import Store
from kvlab.store.tunes import study_name
from kvlab.tune.driver import Tuner
from tests.tune_data import CANDIDATES, FIRST_ROUND, N_ITEMS, SPEC, item_result

WORKER = "test-host:w0"
#: How the configs the first round proposes (the space's initial design) do: bytes per baseline byte and the
#: items they get wrong (int2 all: stopped after the first round); any other config 0.5 and none.
OUTCOMES = {config.label: (fraction, wrong) for config, fraction, wrong in CANDIDATES.values()}
OUTCOMES[KVCacheConfig().label] = (1.0, ())


def _write(store: Store, trial_id: int, config: KVCacheConfig, name: str, item: int) -> None:
    fraction, wrong = OUTCOMES.get(config.label, (0.5, ()))
    store.add_item_result(trial_id, item_result(config, name, fraction, wrong, item))


class CancelledInSecondRound:
    """Runs every queued trial to its item limit, as a worker would; in the second round it writes one
    item of the first trial it claims, then cancels the tune through the store (the page's Cancel)."""

    def __init__(self, store: Store) -> None:
        self.store, self.drains = store, 0
        self.in_flight: int | None = None

    def drain(self, experiment_id: int, stopping: Callable[[], bool]) -> None:
        self.drains += 1
        for trial in self.store.claim_trials(WORKER, max_trials=100, experiment_id=experiment_id):
            config = KVCacheConfig(**trial.config)
            self.store.set_items_total(trial.id, N_ITEMS)
            limit = trial.item_limit or N_ITEMS
            if self.drains == 2:  # mid-trial: one more item, then the user cancels
                _write(self.store, trial.id, config, trial.config_name, trial.items_done)
                self.in_flight = trial.id
                self.store.cancel_experiment(experiment_id)
                assert stopping()  # the driver's check sees it at once
                return
            for item in range(trial.items_done, limit):
                _write(self.store, trial.id, config, trial.config_name, item)
            self.store.finish_trial(trial.id, "done", worker_id=WORKER)


def test_a_cancelled_tune_ends_cancelled_and_keeps_what_it_found(tmp_path):
    spec = parse_spec(SPEC)
    assert spec.tune is not None
    items = [TaskItem(task="passkey", item_id=f"passkey-256-{i}", context="", question="", answer="12345",
                      context_length=256, depth=0.5, max_new_tokens=4) for i in range(N_ITEMS)]
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        experiment_id = store.create_experiment(spec, {}, item_limit=FIRST_ROUND)
        points = len(candidate_grid(spec.tune))
        store.start_tune(experiment_id, points, (points + 1) * N_ITEMS, "test-driver")
        executor = CancelledInSecondRound(store)
        tuner = Tuner(store, experiment_id, spec, items, executor, "test-driver", say=lambda line: None)
        judged = {}

        def after_first_round(*args, **kwargs):  # the verdicts stored before the cancel
            outcome = judge(*args, **kwargs)
            judged.update({c.trial_id: c for c in store.candidates(experiment_id)})
            return outcome

        judge, tuner._judge = tuner._judge, after_first_round
        assert tuner.run() == {}  # no recommendation: it was cancelled
        assert executor.drains == 2 and executor.in_flight is not None
        assert store.tune(experiment_id).state == "cancelled"
        assert store.get_experiment(experiment_id).status == "cancelled"
        in_flight = next(t for t in store.trials(experiment_id) if t.id == executor.in_flight)
        assert in_flight.status == "cancelled" and in_flight.items_done == FIRST_ROUND + 1  # its items kept
        after = {c.trial_id: c for c in store.candidates(experiment_id)}
        assert judged and all(after[trial_id] == candidate for trial_id, candidate in judged.items())
        study = optuna.load_study(study_name=study_name(experiment_id), storage=store.study_storage_url())
        states = [t.state for t in study.trials]
        assert optuna.trial.TrialState.RUNNING not in states  # open proposals failed, not left running
        told = [c for c in after.values() if c.number is not None and c.state != "active"]
        assert [c.state for c in told] == ["stopped"]  # int2, clearly inferior after the first round
        assert all(study.trials[c.number].state == optuna.trial.TrialState.COMPLETE for c in told)
