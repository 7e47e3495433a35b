"""A detached Ray driver for an experiment queued by the dashboard with the Ray executor.

``python -m kvlab.experiments.ray_driver ID --address ADDRESS`` starts :class:`RayWorkers` for the stored
experiment ``ID`` and waits until it has ended; :func:`submit_to_ray` stores an experiment and starts
this driver as a process that outlives the dashboard's request (like the local workers of
:func:`kvlab.experiments.submit.submit`), logging to the workers' log directory.  A cluster that
cannot take the experiment (SQLite on several nodes, no node big enough) fails its trials with the
reason, which the experiment page shows.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence

from kvlab.config import ConfigError, ExperimentSpec, parse_spec
from kvlab.paths import log_dir
from kvlab.experiments.ray_executor import RayWorkers, check_ray_address
from kvlab.experiments.ray_run import settle
from kvlab.experiments.submit import store_experiment
from kvlab.store import Store, require_shared_store


def submit_to_ray(spec: ExperimentSpec, warnings: Sequence[str], address: str | None) -> int:
    """Queue the experiment and start its Ray driver in the background; returns its id.  An address
    where no cluster answers, or an in-memory store, is refused before anything is stored."""
    check_ray_address(address)
    require_shared_store()
    with Store() as store:
        experiment_id = store_experiment(store, spec, warnings)
    folder = log_dir()
    folder.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "kvlab.experiments.ray_driver", str(experiment_id)]
    args += ["--address", address] if address else []
    with open(folder / f"ray-driver-{experiment_id}.log", "ab") as log:  # the child keeps its own copy
        subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return experiment_id


def drive(experiment_id: int, address: str | None) -> str | None:
    """Run the stored experiment on the cluster until it ends; why it did not end done, if so."""
    with Store() as store:
        spec = parse_spec(store.get_experiment(experiment_id).spec)
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
