"""``kvlab`` command line: the same operations as the dashboard.

Exit statuses (0 success, 2 user error, 1 internal error, 130 Ctrl-C, 141 closed pipe) are
:mod:`kvlab.cli.exits`'s; every error is one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from typing import TYPE_CHECKING, NoReturn

from kvlab.cli import exits as cli_exit
from kvlab.cli.doctor import add_doctor_parser
from kvlab.cli.engines import add_engines_parser
from kvlab.cli.options import add_executor_options, add_margin_options, int_between, margin_overrides, positive_int
from kvlab.cli.outputs import check_output, write_output
from kvlab.cli.serve import add_serve_parser
from kvlab.cli.store import add_store_commands
from kvlab.cli.tune import add_tune_parser
from kvlab.core.backends import BACKEND_NAMES, BACKENDS
from kvlab.core.experiment_spec import BackendSpec, ExperimentSpec
from kvlab.experiments.launcher import MAX_LOCAL_WORKERS
from kvlab.secrets import install_log_redaction
from kvlab.spec_files import load_spec
from kvlab.threads import share_cores

if TYPE_CHECKING:
    from kvlab.experiments.runner import ExperimentRun
    from kvlab.experiments.submit import Executor

VERBOSE_HELP = "show the libraries' logs and per-file progress bars (also: KVLAB_VERBOSE=1)"
#: Measured on a 2-core machine: 5.5 s for a bare load when idle, 9 s within `kvlab run examples/tiny.toml` when busy.
FIRST_LOAD = "imports torch and transformers first: about 10 s on 2 CPU cores"


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (``error: kvlab ls: argument --limit: ...``), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(cli_exit.EXIT_USER, f"error: {self.prog}: {message} (see `{self.prog} --help`)\n")


def with_backend_kind(spec: ExperimentSpec, kind: str) -> ExperimentSpec:
    """``spec`` on backend ``kind`` (``kvlab run --backend``): the ``[backend]`` fields that only other
    kinds read (an endpoint's base_url, the embedded engine's device) are dropped, not refused."""
    unread = {name for backend in BACKENDS.values() for name in backend.fields} - set(BACKENDS[kind].fields)
    backend = spec.backend.model_dump(exclude=unread) | {"kind": kind}
    return spec.model_copy(update={"backend": BackendSpec.model_validate(backend)})


def _cmd_run(args: argparse.Namespace) -> int:
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
    print(render(run.summaries(), run.results, run.baseline_name))
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


def _cmd_models(args: argparse.Namespace) -> int:
    from kvlab.models import DEFAULT_MODEL, list_models, pull_model

    if args.action == "pull":
        if args.verbose:
            from kvlab.models.quiet import set_verbose

            set_verbose()
        path = pull_model(args.name, progress=lambda msg: print(msg, file=sys.stderr))
        print(path)
        return 0
    for status in list_models():
        mark = "pulled" if status.pulled else "not pulled"
        default = " (default)" if status.name == DEFAULT_MODEL else ""
        print(f"{status.name:16} {mark:11} {status.display_name}{default}")
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    """Every registered format and method, read from the registries (nothing imported heavily)."""
    from kvlab.core.formats import FORMATS
    from kvlab.core.methods import BUDGETS, HEAD_BUDGETS, METHODS, PARAMS, REFUSED

    print("quantization (quant): format, bits, stored as, scale groups, vLLM / SGLang --kv-cache-dtype")
    for f in FORMATS.values():
        groups = f"group_size {'/'.join(map(str, f.group_sizes))}" if f.group_sizes else "-"
        aliases = f" (also: {', '.join(f.aliases)})" if f.aliases else ""
        print(f"  {f.name:10} {f.bits:2} bit  {f.storage_dtype:14} {groups:22} "
              f"vLLM {f.vllm or '-'} / SGLang {f.sglang or '-'}  {f.description}{aliases}")
    print("eviction (evict): exactly one budget per config")
    for budget, text in ((kind.name, kind.help) for kind in BUDGETS.values()):
        print(f"  {budget}: {text}")
    print("  parameters: " + "; ".join(f"{name} = {p.default} ({p.low}..{p.high}): {p.help}"
                                       for name, p in PARAMS.items()))
    for m in METHODS.values():
        checked = "checked on the default model" if m.checked_on_default_model else "NOT checked on the default model"
        params = f"; params {', '.join(m.params)}" if m.params else ""
        aliases = f"; also: {', '.join(m.aliases)}" if m.aliases else ""
        decodes = "scores during generation" if m.decodes else f"not during generation: {m.decode_refusal}"
        heads = "head-wise budgets" if m.headwise else f"no head-wise budget: {m.heads_refusal}"
        print(f"  {m.name:20} {m.description} ({m.paper})  [{', '.join(m.budgets)}; kvpress {m.press}{params}"
              f"{aliases}; {checked}; {decodes}; {heads}]")
    print("head budgets (heads; alpha_safeguard = 0.2, the least share of an equal split a head keeps):")
    for h in HEAD_BUDGETS.values():
        press = f"kvpress {h.press}, " if h.press else ""
        print(f"  {h.name:20} {h.description} ({press}{h.paper})")
    print("compression during generation (decode = {interval, target_tokens | ratio, buffer}): kvpress's "
          "DecodingPress, scored by the config's evict method; its prompt budget is then optional")
    print("kvpress scorer presses not offered:")
    for press, reason in REFUSED.items():
        print(f"  {press}: {reason}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kvlab", description="KV-cache compression lab bench")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an experiment spec (TOML) here, store it, print the tradeoff table")
    run.add_argument("spec", help="path to a spec TOML (see examples/)")
    run.add_argument("--json", metavar="OUT", help="write spec, environment, summaries and every item result")
    run.add_argument("--backend", choices=BACKEND_NAMES,
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
    run.set_defaults(func=_cmd_run)
    models = sub.add_parser("models", help="list or pull models")
    models_sub = models.add_subparsers(dest="action", required=True)
    models_sub.add_parser("list", help="known models and whether they are pulled")
    pull = models_sub.add_parser("pull", help="fetch and convert a model once")
    pull.add_argument("name")
    pull.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    models.set_defaults(func=_cmd_models)
    methods = sub.add_parser("methods", help="list quantization formats and eviction methods")
    methods.set_defaults(func=_cmd_methods)
    add_tune_parser(sub)
    add_serve_parser(sub)
    add_doctor_parser(sub)
    add_engines_parser(sub)
    add_store_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    share_cores()  # before any command imports torch
    argv = sys.argv[1:] if argv is None else argv
    install_log_redaction()  # no log line of any command shows a URL password or a key
    args = build_parser().parse_args(argv)
    return cli_exit.run(lambda: args.func(args), argv)


def entry() -> None:
    """The ``kvlab`` command: :func:`main`, then the process's end (see :func:`kvlab.cli.exits.exit_process`)."""
    cli_exit.exit_process(main())


if __name__ == "__main__":
    entry()
