"""The dashboard's launches without Streamlit: the new-experiment page's sweep on local workers or a Ray
cluster, or tune driven by a detached ``kvlab tune``, and the list's Rerun, each through
:mod:`kvlab.experiments.submit` with what a web page may submit (:func:`page_limits`: task files only from the
data directory, a path typed there must not reach any other file on the host; the dashboard's key only to the
URL it belongs to, the run's worker would send it to the spec's ``base_url``).

A spec refused before it is stored raises :class:`Refused`, whose message is the one line the page
shows; nothing was stored.  What only the model can tell fails the stored experiment (or tune), and
its page says why.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.dashboard.executor_form import Executor
from kvlab.dashboard.tune_launch import record_launch
from kvlab.errlog import one_line
from kvlab.experiments.submit import Executor as Runner
from kvlab.experiments.submit import Handle, LocalWorkers, PageLimits, Submitted, rerun, submit
from kvlab.paths import data_dir
from kvlab.store import ExperimentStore, StoreError


class Refused(Exception):
    """Why a launch was refused, in one line; nothing was stored."""


def launch_sweep(spec: ExperimentSpec, warnings: Sequence[str], executor: Executor, workers: int) -> int:
    """Queue the sweep for ``workers`` local workers, started here, or for the Ray cluster the form chose
    (a detached Ray driver); returns its id."""
    if executor.kind == "ray":
        from kvlab.experiments.ray_driver import RayDriver

        return _submit(spec, RayDriver(executor.address), warnings).experiment_id
    return _submit(spec, LocalWorkers(workers), warnings).experiment_id


def launch_tune(spec: ExperimentSpec, warnings: Sequence[str], store: ExperimentStore) -> int:
    """Store the tune and start its driver, a detached ``kvlab tune`` on this host (the model loads
    there); records on the tune that the dashboard launched it, with the process's log; returns its id."""
    from kvlab.tune.session import DetachedTune

    submitted = _submit(spec, DetachedTune(), warnings)
    record_launch(store, submitted.experiment_id, submitted.handle.log)
    return submitted.experiment_id


def rerun_from_page(experiment_id: int, workers: int) -> int:
    """The list's Rerun: the experiment's spec queued again, held to what a page may submit (``ConfigError``,
    ``StoreError``: one line, nothing stored); returns the new id."""
    return rerun(experiment_id, workers, page=page_limits())


def page_limits() -> PageLimits:
    """What a spec submitted from the dashboard is held to (:class:`kvlab.experiments.submit.PageLimits`)."""
    return PageLimits(files_under=data_dir())


def _submit(spec: ExperimentSpec, runner: Runner[Handle], warnings: Sequence[str]) -> Submitted[Handle]:
    try:
        return submit(spec, runner, warnings, page=page_limits())
    except (ConfigError, StoreError) as error:
        raise Refused(one_line(str(error))) from None
