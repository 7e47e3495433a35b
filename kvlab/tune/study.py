"""The Optuna side of a tune: its study, opened where the store keeps it
(:meth:`kvlab.store.protocol.Tunes.study_storage_url`), and how a proposal becomes a KV config."""

from __future__ import annotations

import logging
from typing import Any, Literal

import optuna

from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tune_spec import TuneSpec

OBJECTIVES = ("kv_bytes", "accuracy")
DIRECTIONS: tuple[Literal["minimize", "maximize"], ...] = ("minimize", "maximize")


def open_study(storage_url: str, name: str, tune: TuneSpec, seed: int) -> optuna.Study:
    """Create or load the study ``name`` in the storage at ``storage_url`` (a resumed tune finds its trials there)."""
    optuna.logging.set_verbosity(logging.WARNING)
    optuna.logging.disable_default_handler()
    storage = optuna.storages.RDBStorage(storage_url, engine_kwargs={"pool_pre_ping": True})
    sampler: optuna.samplers.BaseSampler
    if tune.sampler == "gp":
        sampler = optuna.samplers.GPSampler(seed=seed)
    else:
        # Few trials: start modelling early (Optuna's default waits for 10 random ones).
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(8, max(tune.max_trials or 8, 2) // 2))
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, directions=list(DIRECTIONS),
                                load_if_exists=True)
    if not study.trials:
        for params in initial_design(tune):
            study.enqueue_trial(params, skip_if_exists=True)
    return study


def initial_design(tune: TuneSpec) -> list[dict[str, Any]]:
    """The first proposals, as Optuna parameters (:meth:`kvlab.core.space.ConfigSpace.initial_design`)."""
    return tune.space().initial_design()


def suggest_config(trial: optuna.Trial, tune: TuneSpec) -> KVCacheConfig:
    """The config a proposal names (:meth:`kvlab.core.space.ConfigSpace.suggest`)."""
    return KVCacheConfig(**tune.space().suggest(trial))


def tell(study: optuna.Study, number: int, kv_bytes: float, accuracy: float, constraints: dict[str, float]) -> None:
    """Report a candidate's objectives and constraints (feasible when every value is <= 0)."""
    trial = optuna.Trial(study, study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number))
    for key, value in constraints.items():
        trial.set_constraint(key, value)
    study.tell(trial, [kv_bytes, accuracy], skip_if_finished=True)


def fail(study: optuna.Study, number: int) -> None:
    """A proposal that was never evaluated (its trial failed, or the tune was cancelled)."""
    study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
