"""``kvlab run``: an experiment spec run here (or queued for local workers, or on a Ray cluster)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from typing import TYPE_CHECKING

from kvlab.cli import exits as cli_exit
from kvlab.cli.options import (
    VERBOSE_HELP,
    add_executor_options,
    add_margin_options,
    int_between,
    margin_overrides,
    positive_int,
)
from kvlab.cli.outputs import check_output, write_output
from kvlab.core.backends import BACKENDS
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import BackendSpec, ExperimentSpec
from kvlab.core.limits import FieldProblem
from kvlab.experiments.launcher import MAX_LOCAL_WORKERS
from kvlab.spec_files import load_spec

if TYPE_CHECKING:
    from kvlab.experiments.runner import ExperimentRun
    from kvlab.experiments.submit import Executor

#: Measured on a 2-core machine: 5.5 s for a bare load when idle, 9 s within `kvlab run examples/tiny.toml` when busy.
FIRST_LOAD = "imports torch and transformers first: about 10 s on 2 CPU cores"


def with_backend_kind(spec: ExperimentSpec, kind: str) -> ExperimentSpec:
    """``spec`` on backend ``kind`` (``kvlab run --backend``): the ``[backend]`` fields that only other
    kinds read (an endpoint's base_url, the embedded engine's device) are dropped, not refused."""
    unread = {name for backend in BACKENDS.values() for name in backend.fields} - set(BACKENDS[kind].fields)
    backend = spec.backend.model_dump(exclude=unread) | {"kind": kind}
    moved = spec.model_copy(update={"backend": BackendSpec.model_validate(backend)})
    try:
        moved.check_load()  # a [load] table is asked for, never dropped: refused where it cannot run
    except FieldProblem as problem:
        raise ConfigError(f"--backend {kind}: {problem.path}: {problem}") from None
    return moved


def cmd_run(args: argparse.Namespace) -> int:
    spec, warnings = load_spec(args.spec)  # before the heavy imports below: a bad spec is refused at once
    if spec.tune is not None:  # `kvlab run` would run the baseline and the fixed configs, not the search
        raise cli_exit.UserError(f"{args.spec}: has a [tune] table, which `kvlab run` does not search; "
                                 f"run `kvlab tune {shlex.quote(args.spec)}`, or remove the [tune] table")
    json_out = check_output(args.json, "--json", create_parents=True) if args.json else None
    on_ray = _check_executor(args)
    if args.backend:
        spec = with_backend_kind(spec, args.backend)
    spec = spec.model_copy(update=margin_overrides(args))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.verbose:  # before --background: the workers it starts inherit it
        from kvlab.models.quiet import set_verbose

        set_verbose()
    if args.background:
        from kvlab.cli.store import submit_background

        return submit_background(spec, warnings, args.workers)
    from kvlab.experiments.report import render

    # its own step: the imports and the load come before the bar (on Ray the model loads on the nodes)
    loading = BACKENDS[spec.backend.kind].loads_model_here and not on_ray
    started = time.monotonic()

    def starting() -> None:  # once the spec is refused nothing, before the model loads
        nonlocal started
        print(f"{spec.name}: {len(spec.all_configs())} configs on {spec.model} ({spec.backend.kind})", file=sys.stderr)
        if loading:
            print(f"loading {spec.model} ({FIRST_LOAD})", file=sys.stderr, flush=True)
        started = time.monotonic()

    if args.no_store:
        from kvlab.experiments.runner import run_experiment

        if spec.load is not None:  # its levels are stored with their trials, as they land
            raise cli_exit.UserError(f"{args.spec}: has a [load] table, whose levels kvlab stores with each config's "
                                     "trial: drop --no-store")

        starting()
        run = run_experiment(spec, progress=not args.quiet, limit=args.limit)
    else:
        from kvlab.experiments.submit import InThisProcess, RunCancelled, submit

        def announce(experiment_id: int, url: str) -> None:  # called once the model is loaded
            if loading:
                print(f"loaded {spec.model} in {time.monotonic() - started:.0f} s", file=sys.stderr)
            print(f"experiment {experiment_id} in {url}: `kvlab show {experiment_id}`, or the dashboard's "
                  f"/experiment?id={experiment_id}", file=sys.stderr)

        options = {"limit": args.limit, "progress": not args.quiet, "starting": starting, "announce": announce}
        executor: Executor[ExperimentRun] = InThisProcess(**options)
        if on_ray:  # the same contract, on the cluster
            from kvlab.experiments.ray_run import OnRay

            executor = OnRay(args.ray_address, **options)
        try:
            run = submit(spec, executor, warnings).handle
        except RunCancelled as cancelled:
            print(f"interrupted: {cancelled} (`kvlab show {cancelled.experiment_id}`)", file=sys.stderr)
            return cli_exit.EXIT_INTERRUPTED
        if run.failure and not run.results:  # refused before any result (e.g. a prompt longer than the model takes)
            raise cli_exit.UserError(run.failure)
    run.warnings = warnings + run.warnings
    for warning in run.warnings[len(warnings):]:
        print(f"warning: {warning}", file=sys.stderr)
    print(render(run.summaries(), run.results, run.baseline_name, load=run.load,
                 target=spec.load.target if spec.load is not None else None))
    print(f"\n{len(run.results)} evaluations in {run.wall_s:.0f} s", file=sys.stderr)
    if json_out:
        write_output(json_out, json.dumps(run.to_dict(), indent=1), "--json")
        print(f"wrote {json_out}", file=sys.stderr)
    if run.failure:  # the engine's failure, as when it raises EngineFailure before any result
        raise cli_exit.UserError(f"the run stopped early, {len(run.results)} results kept: {run.failure}")
    return 0


def _check_executor(args: argparse.Namespace) -> bool:
    """Whether the run goes to Ray."""
    if args.executor != "ray":
        if args.ray_address:
            raise cli_exit.UserError("--ray-address is for --executor ray")
        return False
    if args.background or args.no_store:
        raise cli_exit.UserError("--executor ray stores the run and waits for the cluster: "
                                 "drop --background / --no-store")
    return True  # its address is checked before the run is stored (kvlab.experiments.ray_run.OnRay)



def add_run_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run an experiment spec (TOML) here, store it, print the tradeoff table")
    run.add_argument("spec", help="path to a spec TOML (see examples/)")
    run.add_argument("--json", metavar="OUT", help="write spec, environment, summaries and every item result")
    run.add_argument("--backend", choices=tuple(BACKENDS),
                     help="override the spec's backend kind")
    run.add_argument("--limit", type=positive_int, help="run only the first N items (a quick check)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    add_margin_options(run)
    where = run.add_mutually_exclusive_group()
    where.add_argument("--background", action="store_true",
                       help="queue the experiment and run it in local worker processes instead of here")
    where.add_argument("--no-store", action="store_true",
                       help="store nothing (by default the run is stored in KVLAB_DATABASE_URL, else db/kvlab.sqlite, "
                            "and listed by `kvlab ls` and the dashboard)")
    run.add_argument("--workers", type=int_between(0, MAX_LOCAL_WORKERS), default=1,
                     help=f"with --background: local workers to start (0: none; at most {MAX_LOCAL_WORKERS})")
    add_executor_options(run, "a worker in this process")
    run.set_defaults(func=cmd_run)
