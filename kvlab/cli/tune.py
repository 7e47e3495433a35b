"""``kvlab tune``: search a spec's ``[tune]`` space for the sweet spot, and print a recommendation."""

from __future__ import annotations

import argparse
import json
import sys
import time

from kvlab.cli import exits as cli_exit
from kvlab.cli.options import add_executor_options, add_margin_options, margin_overrides, positive_int
from kvlab.cli.outputs import check_output, write_output
from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.experiments.launcher import BackgroundTune, start_tune_driver
from kvlab.spec_files import load_spec


def add_tune_parser(sub: argparse._SubParsersAction) -> None:
    tune = sub.add_parser("tune", help="search a spec's [tune] space for the sweet spot (Optuna, early stopping)")
    tune.add_argument("spec", nargs="?", help="a spec TOML with a [tune] table (see examples/tune.toml)")
    tune.add_argument("--resume", type=positive_int, metavar="ID",
                      help="take over the tune of experiment ID whose `kvlab tune` stopped (crash, Ctrl-C)")
    # internal: the detached driver of a tune that `kvlab tune --background` or the dashboard stored
    tune.add_argument("--drive", type=positive_int, metavar="ID", help=argparse.SUPPRESS)
    add_margin_options(tune)
    tune.add_argument("--max-trials", type=positive_int, metavar="N", help="override [tune] max_trials")
    tune.add_argument("--workers", type=int, choices=[0, 1], default=1,
                      help="1: run the rounds with a worker in this process (default); 0: only drive the search, "
                           "`kvlab worker` processes on any host using the same store run the rounds")
    add_executor_options(tune, "the rounds run here, or by `kvlab worker`s with --workers 0")
    tune.add_argument("--json", metavar="OUT", help="write the recommendation as JSON")
    tune.add_argument("--background", action="store_true",
                      help="run the tune in a detached process (its log in $KVLAB_LOG_DIR, else "
                           "$KVLAB_HOME/logs, default ~/.cache/kvlab/logs) and return at once")
    tune.set_defaults(func=cmd_tune)


def _spec(args: argparse.Namespace) -> tuple[ExperimentSpec | None, list[str]]:
    """The spec to submit, with its warnings; None to take over a stored tune (--resume, --drive)."""
    if args.resume is not None or args.drive is not None:
        if args.spec or margin_overrides(args) or args.max_trials is not None:
            flag = "--resume" if args.resume is not None else "--drive"
            raise cli_exit.UserError(f"{flag} continues the stored tune as it was: give no spec and no overrides")
        return None, []
    if not args.spec:
        raise cli_exit.UserError("give a spec with a [tune] table, or --resume ID")
    spec, warnings = load_spec(args.spec)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    tune = spec.tune
    if tune is None:
        raise cli_exit.UserError(f"{args.spec}: no [tune] table: `kvlab run` runs a fixed list of configs; "
                                 "examples/tune.toml shows a search space")
    spec = spec.model_copy(update=margin_overrides(args))  # the margins (MARGIN_INPUTS), never the tune table
    if args.max_trials is not None:
        spec = spec.model_copy(update={"tune": tune.model_copy(update={"max_trials": args.max_trials})})
    return spec, warnings


def cmd_tune(args: argparse.Namespace) -> int:
    spec, warnings = _spec(args)
    on_ray = args.executor == "ray"
    if args.ray_address and not on_ray:
        raise cli_exit.UserError("--ray-address is for --executor ray")
    if args.drive is not None and args.background:
        raise cli_exit.UserError("--drive runs the stored tune in this process: drop --background")
    if on_ray and args.background:
        raise cli_exit.UserError("--executor ray drives the cluster from here: drop --background")
    json_out = check_output(args.json, "--json", create_parents=True) if args.json else None
    if args.background:
        background = _start_background(spec, warnings, args.resume)
        print(f"tune started in the background; log: {background.log}; the dashboard lists it under Experiments",
              file=sys.stderr)
        return 0
    from kvlab.experiments.submit import submit
    from kvlab.tune.recommend import describe
    from kvlab.tune.session import TuneHere, drive_stored

    started = time.monotonic()

    def announce(experiment_id: int, url: str) -> None:
        print(f"tune: experiment {experiment_id} in {url}: the dashboard's /tune?id={experiment_id} follows it "
              f"live; resume after a crash with `kvlab tune --resume {experiment_id}`", file=sys.stderr)

    driving = TuneHere(workers=args.workers, on_ray=on_ray, ray_address=args.ray_address,
                       say=lambda line: print(line, file=sys.stderr, flush=True), announce=announce)
    try:
        if spec is None:
            stored = args.resume if args.resume is not None else args.drive
            outcome = drive_stored(stored, resuming=args.resume is not None, driving=driving)
        else:
            outcome = submit(spec, driving, warnings).handle
    except KeyboardInterrupt:
        print("interrupted: the tune is kept; continue it with `kvlab tune --resume ID`", file=sys.stderr)
        return cli_exit.EXIT_INTERRUPTED
    answer = outcome.answer
    if not answer:
        print(f"experiment {outcome.experiment_id}: the tune was cancelled", file=sys.stderr)
        return cli_exit.EXIT_INTERRUPTED
    print("\n".join(describe(answer)))
    grid = answer.get("grid_item_evals") or 0
    print(f"\n{answer['item_evals']} item evaluations"
          + (f", {answer['item_evals'] / grid:.0%} of the full grid's {grid}" if grid else "")
          + f", in {time.monotonic() - started:.0f} s (experiment {outcome.experiment_id})", file=sys.stderr)
    if json_out:
        write_output(json_out, json.dumps({"experiment_id": outcome.experiment_id, **answer}, indent=1), "--json")
        print(f"wrote {json_out}", file=sys.stderr)
    return 0


def _start_background(spec: ExperimentSpec | None, warnings: list[str], resume: int | None) -> BackgroundTune:
    """A new tune is submitted (stored, then driven by a detached ``kvlab tune --drive ID``); a stopped
    one is resumed by a detached ``kvlab tune --resume ID``."""
    if spec is not None:
        from kvlab.experiments.submit import submit
        from kvlab.tune.session import DetachedTune

        return submit(spec, DetachedTune(), warnings).handle
    from kvlab.store.database import require_shared_store

    require_shared_store()  # the tune's process must see the store this one does
    return start_tune_driver(["--resume", str(resume)])
