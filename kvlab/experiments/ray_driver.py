"""A detached Ray driver for an experiment the dashboard launches on Ray (:class:`RayDriver`).

``python -m kvlab.experiments.ray_driver ID --address ADDRESS`` starts :class:`RayWorkers` for the stored
experiment ``ID`` and waits until it has ended; :class:`RayDriver`, once the experiment is stored,
starts it as a process that outlives the dashboard's request (like the local workers of
:class:`kvlab.experiments.submit.LocalWorkers`), logging to the workers' log directory.  A cluster
that cannot take the experiment (SQLite on several nodes, no node big enough) fails its trials with
the reason, which the experiment page shows.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ExperimentSpec, parse_spec
from kvlab.experiments.launcher import start_detached
from kvlab.experiments.ray_executor import RayWorkers, refuse_ray_run
from kvlab.experiments.ray_run import settle
from kvlab.experiments.submit import Start
from kvlab.paths import log_dir
from kvlab.store import Store


@dataclass(frozen=True)
class RayDriver:
    """Run the stored experiment on the Ray cluster at ``address`` from a detached driver process (its
    handle).  An address where no cluster answers, or an in-memory store, is refused before anything
    is stored."""

    address: str | None = None

    def refuse(self, spec: ExperimentSpec) -> None:
        refuse_ray_run(self.address)

    @contextmanager
    def ready(self, spec: ExperimentSpec) -> Iterator[Start[subprocess.Popen[bytes]]]:
        yield lambda store, experiment_id: self._start(experiment_id)

    def _start(self, experiment_id: int) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "kvlab.experiments.ray_driver", str(experiment_id)]
        args += ["--address", self.address] if self.address else []
        return start_detached(args, log_dir() / f"ray-driver-{experiment_id}.log")


def drive(experiment_id: int, address: str | None) -> str | None:
    """Run the stored experiment on the cluster until it ends; why it did not end done, if so."""
    with Store() as store:
        spec = parse_spec(store.get_experiment(experiment_id).spec, stored=True)
        try:
            workers = RayWorkers(None, experiment_id, spec, address)
        except ConfigError as error:
            for trial in store.trials(experiment_id):
                store.finish_trial(trial.id, "failed", str(error))
            return str(error)
        with workers:
            outcomes = workers.wait()
        return settle(store, experiment_id, outcomes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlab.experiments.ray_driver")
    parser.add_argument("experiment_id", type=int)
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"))
    args = parser.parse_args(argv)
    failure = drive(args.experiment_id, args.address)
    if failure:
        print(f"experiment {args.experiment_id}: {failure}", file=sys.stderr)
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
