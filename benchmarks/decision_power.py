"""Decision power: how many items accuracy and fidelity each need to certify a config.

On examples/quick.toml's configs and items (its embedded run, or a ``kvlab run --json`` file of it),
for each config: the smallest prefix of the items, interleaved over context lengths
(kvlab.experiments.runner.interleave), on which the config is acceptable, with Holm across all the
spec's configs, under each criterion:
  accuracy   accuracy non-inferior within 5 points (``Margins(max_drop=0.05, max_kl=0)``);
  KL         mean KL certified below DEFAULT_MAX_KL nats per token and accuracy not shown to drop by
             more than 5 points (``Margins(max_drop=0.05, max_kl=DEFAULT_MAX_KL)``);
  agreement  top-1 agreement certified above 90%, accuracy likewise (``min_agreement=0.9``).
Each prefix is judged by kvlab.analysis.summary.summarize on the results of its items: no model
runs beyond the one run.  "> N": not acceptable even on all N items; for accuracy, the items
kvlab.analysis.decision.items_needed extrapolates for a config exactly as accurate as the baseline
follow in brackets.  A "*" marks a config accepted on that prefix but not on all N items.

Then whether the criteria rank the configs alike: Spearman's rho across configs between the accuracy
difference against the baseline and the mean KL (they agree when rho is negative: more accurate,
closer to the baseline), and between the difference and the agreement (positive), on all N items;
and "fidelity needs X of the items accuracy needs" over the configs both criteria certify.  Counts of
items do not depend on the machine's load.

Usage: python benchmarks/decision_power.py [--spec examples/quick.toml] [--limit N] [--json OUT]
       [--from-json IN] [--save-run OUT]
(IN: written by `kvlab run examples/quick.toml --json IN`, or by --save-run: reuses that run)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvlab.threads import share_cores

share_cores()  # before torch loads (kvlab/threads.py): the machine is shared

from scipy import stats  # noqa: E402

from kvlab.analysis.decision import items_needed  # noqa: E402
from kvlab.analysis.summary import ConfigSummary, summarize  # noqa: E402
from kvlab.core.margins import DEFAULT_MAX_KL, Margins  # noqa: E402
from kvlab.core.results import ItemResult  # noqa: E402
from kvlab.experiments.runner import interleave  # noqa: E402

MAX_DROP = 0.05
CRITERIA: dict[str, Margins] = {
    "accuracy": Margins(max_drop=MAX_DROP, max_kl=0),
    "KL": Margins(max_drop=MAX_DROP, max_kl=DEFAULT_MAX_KL),
    "agreement": Margins(max_drop=MAX_DROP, max_kl=0, min_agreement=0.9),
}
FIDELITY_CRITERIA = ("KL", "agreement")

Key = tuple[str, str]  # (item_id, task): how summarize pairs a config's results with the baseline's


@dataclass
class Run:
    """What the benchmark reads of a run: its results, config labels (baseline first) and items in
    interleaved order."""

    results: list[ItemResult]
    configs: list[str]
    order: list[Key]

    @property
    def baseline(self) -> str:
        return self.configs[0]


def item_order(results: Sequence[ItemResult], baseline: str) -> list[Key]:
    """The items, interleaved over (task, context length), in the order the baseline ran them."""
    rows = interleave([r for r in results if r.config_name == baseline])
    return list(dict.fromkeys((r.item_id, r.task) for r in rows))


def from_json(path: Path) -> Run:
    data = json.loads(path.read_text())
    configs = [c["label"] for c in data["configs"]]
    results = [ItemResult(**row) for row in data["results"]]
    return Run(results, configs, item_order(results, configs[0]))


def run_spec(spec_path: str, limit: int | None, save: Path | None) -> Run:
    from kvlab.engines.embedded import EmbeddedEngine
    from kvlab.experiments.runner import build_items, run_experiment
    from kvlab.models import load_model
    from kvlab.spec_files import load_spec

    spec, warnings = load_spec(spec_path)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    engine = EmbeddedEngine(load_model(spec.model), seed=spec.seed)
    items = interleave(build_items(spec, engine.tokenizer))[:limit]
    run = run_experiment(spec, engine, progress=True, items=items)
    if run.failure:
        raise SystemExit(f"the run stopped early: {run.failure}")
    if save:
        save.write_text(json.dumps(run.to_dict(), indent=1))
        print(f"wrote the run to {save} (--from-json {save} reuses it)", file=sys.stderr)
    print(f"{len(run.results)} evaluations in {run.wall_s:.0f} s", file=sys.stderr)
    return Run(run.results, [c.label for c in run.configs], item_order(run.results, run.baseline_name))


def prefix_summaries(run: Run, n: int, margins: Margins) -> dict[str, ConfigSummary]:
    keys = set(run.order[:n])
    rows = [r for r in run.results if (r.item_id, r.task) in keys]
    return {s.config_name: s for s in summarize(rows, run.baseline, margins)}


def first_accepted(run: Run, margins: Margins) -> dict[str, int]:
    """Per config, the fewest leading items on which it is acceptable (absent: on no prefix)."""
    needed: dict[str, int] = {}
    for n in range(1, len(run.order) + 1):
        for name, summary in prefix_summaries(run, n, margins).items():
            if summary.non_inferior and name not in needed:
                needed[name] = n
    return needed


def spearman(xs: list[float], ys: list[float]) -> tuple[float | None, float | None]:
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None, None
    result = stats.spearmanr(xs, ys)
    return float(result.statistic), float(result.pvalue)


def number(value: float | None, spec: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="examples/quick.toml")
    parser.add_argument("--limit", type=int, help="the first N items (interleaved over context lengths)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the figures as JSON")
    parser.add_argument("--from-json", type=Path, metavar="IN", help="read a `kvlab run --json` file: no model run")
    parser.add_argument("--save-run", type=Path, metavar="OUT", help="write the run as `kvlab run --json` does")
    args = parser.parse_args()
    if args.from_json:
        run = from_json(args.from_json)
        run.order = run.order[:args.limit] if args.limit else run.order
    else:
        run = run_spec(args.spec, args.limit, args.save_run)
    n = len(run.order)
    compared = [c for c in run.configs if c != run.baseline]

    needed = {name: first_accepted(run, margins) for name, margins in CRITERIA.items()}
    final = {name: prefix_summaries(run, n, margins) for name, margins in CRITERIA.items()}
    figures = final["KL"]  # every summary carries the same accuracy and fidelity figures
    baseline_accuracy = figures[run.baseline].accuracy
    extrapolated = (items_needed(baseline_accuracy, MAX_DROP, len(compared)) if baseline_accuracy is not None
                    else None)

    def cell(criterion: str, config: str) -> str:
        summary = final[criterion].get(config)
        if summary is None or summary.non_inferior is None:
            return "n/a"  # no task can judge it (reason in the summary's task verdicts)
        if config in needed[criterion]:
            return f"{needed[criterion][config]}{'' if summary.non_inferior else '*'}"
        if criterion == "accuracy":
            return f"> {n} (~{extrapolated if extrapolated is not None else '> 100000'})"
        return f"> {n}"

    print(f"{n} items (interleaved over task and context length), {len(compared)} configs "
          f"compared with {run.baseline} (accuracy {number(baseline_accuracy, '.2f')}); Holm across all of them")
    print(f"items needed to certify at {MAX_DROP * 100:g} points: accuracy non-inferiority | mean KL < "
          f"{DEFAULT_MAX_KL:g} | agreement > 90%  ('> N (~M)': M extrapolated by items_needed for a config as "
          "accurate as the baseline; '*': accepted there, not on all N)")
    header = (f"  {'config':16} {'acc diff':>8} {'mean KL':>8} {'agree':>6}   "
              f"{'accuracy':>16} {'KL':>6} {'agreement':>9}")
    print(header)
    rows = []
    for config in compared:
        s = figures[config]
        print(f"  {config:16} {number(s.diff_estimate, '+.3f'):>8} {number(s.mean_kl, '.3g'):>8} "
              f"{number(s.agreement, '.1%'):>6}   {cell('accuracy', config):>16} {cell('KL', config):>6} "
              f"{cell('agreement', config):>9}")
        rows.append({"config": config, "diff_vs_baseline": s.diff_estimate, "mean_kl": s.mean_kl,
                     "agreement": s.agreement,
                     "items_needed": {c: needed[c].get(config) for c in CRITERIA},
                     "accepted_on_all": {c: final[c][config].non_inferior for c in CRITERIA}})

    ranked = [figures[c] for c in compared if figures[c].diff_estimate is not None and figures[c].mean_kl is not None]
    diffs = [s.diff_estimate for s in ranked]
    rho_kl, p_kl = spearman(diffs, [s.mean_kl for s in ranked])
    rho_agree, p_agree = spearman(diffs, [s.agreement for s in ranked])
    print(f"ranking across {len(ranked)} configs, Spearman rho: accuracy difference vs mean KL "
          f"{number(rho_kl, '+.2f')} (p {number(p_kl, '.2g')}; negative: the criteria agree), vs agreement "
          f"{number(rho_agree, '+.2f')} (p {number(p_agree, '.2g')}; positive: they agree)")

    ratios: dict[str, Any] = {}
    for criterion in FIDELITY_CRITERIA:
        both = [c for c in compared if c in needed["accuracy"] and c in needed[criterion]]
        if both:
            fidelity_items = sum(needed[criterion][c] for c in both)
            accuracy_items = sum(needed["accuracy"][c] for c in both)
            ratio = fidelity_items / accuracy_items
            print(f"{criterion}: fidelity needs {ratio:.0%} of the items accuracy needs "
                  f"({fidelity_items} / {accuracy_items}, over the {len(both)} configs both certify)")
        else:
            ratio = None
            print(f"{criterion}: no config certified by both accuracy and {criterion} on {n} items")
        only = [c for c in compared if c in needed[criterion] and c not in needed["accuracy"]]
        if only and extrapolated:
            share = sum(needed[criterion][c] for c in only) / (extrapolated * len(only))
            print(f"  {len(only)} config{'s' * (len(only) > 1)} certified by {criterion}, not by accuracy, "
                  f"on {n} items: {share:.0%} of the {extrapolated} items extrapolated for accuracy")
        ratios[criterion] = {"ratio": ratio, "both": both, "fidelity_only": only}

    if args.json:
        args.json.write_text(json.dumps({
            "items": n, "baseline": run.baseline, "baseline_accuracy": baseline_accuracy, "max_drop": MAX_DROP,
            "max_kl": DEFAULT_MAX_KL, "min_agreement": 0.9, "accuracy_items_extrapolated": extrapolated,
            "configs": rows, "spearman": {"mean_kl": {"rho": rho_kl, "p": p_kl},
                                          "agreement": {"rho": rho_agree, "p": p_agree}},
            "fidelity_over_accuracy": ratios}, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
