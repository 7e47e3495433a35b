"""The Optuna side of a tune: where its study lives, and how a proposal becomes a KV config.

Optuna's RDB storage has tables named ``trials`` and ``alembic_version`` -- the same names as
kvlab's -- so a study never shares kvlab's tables: on SQLite it lives in a sibling file
(``db/kvlab.sqlite`` -> ``db/kvlab.optuna.sqlite``), on PostgreSQL in its own schema of the same
database (``<kvlab's schema>_optuna``, ``kvlab_optuna`` beside ``public``).  Both servers' users
thus need nothing new, and a tune resumes, or is served by many hosts, wherever its store is.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import optuna
from sqlalchemy import URL, Engine, text

from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tune_spec import TuneSpec

OBJECTIVES = ("kv_bytes", "accuracy")
DIRECTIONS: tuple[Literal["minimize", "maximize"], ...] = ("minimize", "maximize")


def optuna_schema(url: URL) -> str:
    """The PostgreSQL schema of a store's studies: its own first search_path schema + ``_optuna``."""
    options = str(url.query.get("options", ""))
    for part in options.split():
        if part.startswith("-csearch_path="):
            return part.split("=", 1)[1].split(",")[0].strip().strip('"') + "_optuna"
    return "kvlab_optuna"


def storage_url(engine: Engine) -> str:
    """The study storage URL beside the store of ``engine`` (password included: never shown or stored)."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        if not database or database == ":memory:" or url.query.get("mode") == "memory":
            raise ValueError("kvlab tune needs a store on disk (a SQLite file or PostgreSQL), not an in-memory one")
        path = Path(database.removeprefix("file:"))
        return URL.create("sqlite", database=str(path.with_name(f"{path.stem}.optuna{path.suffix or '.sqlite'}"))
                          ).render_as_string(hide_password=False)
    schema = optuna_schema(url)
    with engine.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
    query = dict(url.query)
    query["options"] = f"-csearch_path={schema}"
    return url.set(query=query).render_as_string(hide_password=False)


def open_study(engine: Engine, name: str, tune: TuneSpec, seed: int) -> optuna.Study:
    """Create or load the study ``name`` (a resumed tune finds its trials there)."""
    optuna.logging.set_verbosity(logging.WARNING)
    optuna.logging.disable_default_handler()
    storage = optuna.storages.RDBStorage(storage_url(engine), engine_kwargs={"pool_pre_ping": True})
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
