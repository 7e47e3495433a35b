"""``kvlab`` command line: the same operations as the dashboard."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvlab.cli_doctor import add_doctor_parser
from kvlab.cli_serve import add_serve_parser
from kvlab.cli_store import add_store_commands
from kvlab.config import ConfigError, load_spec


def _cmd_run(args: argparse.Namespace) -> int:
    from kvlab.report import render
    from kvlab.runner import run_experiment

    spec, warnings = load_spec(args.spec)
    if args.backend:
        spec = spec.model_copy(update={"backend": spec.backend.model_copy(update={"kind": args.backend})})
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.background:
        from kvlab.cli_store import submit_background

        return submit_background(spec, warnings, args.workers)
    configs = spec.all_configs()
    print(f"{spec.name}: {len(configs)} configs on {spec.model} ({spec.backend.kind})", file=sys.stderr)
    run = run_experiment(spec, progress=not args.quiet, limit=args.limit)
    run.warnings = warnings + run.warnings
    for warning in run.warnings[len(warnings):]:
        print(f"warning: {warning}", file=sys.stderr)
    print(render(run.summaries(), run.results, run.baseline_name))
    print(f"\n{len(run.results)} evaluations in {run.wall_s:.0f} s", file=sys.stderr)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(run.to_dict(), indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    if run.failure:
        print(f"error: the run stopped early, {len(run.results)} results kept: {run.failure}", file=sys.stderr)
        return 1
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from kvlab.models import DEFAULT_MODEL, list_models, pull_model

    if args.action == "pull":
        path = pull_model(args.name, progress=lambda msg: print(msg, file=sys.stderr))
        print(path)
        return 0
    for status in list_models():
        mark = "pulled" if status.pulled else "not pulled"
        default = " (default)" if status.name == DEFAULT_MODEL else ""
        print(f"{status.name:16} {mark:11} {status.display_name}{default}")
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    from kvlab.compress.eviction import PRESSES
    from kvlab.config import QUANT_DTYPES, THRESHOLD_METHODS

    print("quantization (quant):", ", ".join(QUANT_DTYPES))
    print("eviction (evict): budget = ratio (fraction removed) | keep_fraction (top-k) | threshold (quantile)")
    for name, (press, text) in PRESSES.items():
        budgets = "ratio, keep_fraction" + (", threshold" if name in THRESHOLD_METHODS else "")
        print(f"  {name:20} {text}  [{budgets}; kvpress {press.__name__}]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvlab", description="KV-cache compression lab bench")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an experiment spec (TOML) and print the tradeoff table")
    run.add_argument("spec", help="path to a spec TOML (see examples/)")
    run.add_argument("--json", metavar="OUT", help="write spec, environment, summaries and every item result")
    run.add_argument("--backend", choices=["embedded", "openai_compat", "vllm", "sglang"],
                     help="override the spec's backend kind")
    run.add_argument("--limit", type=int, help="run only the first N items (a quick check)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--background", action="store_true",
                     help="store the experiment in the database and run it in local worker processes")
    run.add_argument("--workers", type=int, default=1, help="with --background: local workers to start (0: none)")
    run.set_defaults(func=_cmd_run)
    models = sub.add_parser("models", help="list or pull models")
    models_sub = models.add_subparsers(dest="action", required=True)
    models_sub.add_parser("list", help="known models and whether they are pulled")
    pull = models_sub.add_parser("pull", help="fetch and convert a model once")
    pull.add_argument("name")
    models.set_defaults(func=_cmd_models)
    methods = sub.add_parser("methods", help="list quantization formats and eviction methods")
    methods.set_defaults(func=_cmd_methods)
    add_serve_parser(sub)
    add_doctor_parser(sub)
    add_store_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kvlab.engines.base import EngineFailure
    from kvlab.models import ModelNotAvailableError
    from kvlab.store.errors import StoreError

    try:
        return args.func(args)
    except (ConfigError, EngineFailure, ModelNotAvailableError, StoreError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
