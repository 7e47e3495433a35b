"""Tune against the full grid, on the same items and seed.

The space is examples/quick.toml's extended with group sizes and budgets: formats none/int8/int4/int2 x
group sizes 32/128 x eviction none/streaming_llm/snapkv x removed fractions 0.5/0.625/0.75 -- 48 configs
plus the baseline.  The grid runs every config on every item (``kvlab run``'s path); the tune runs
``kvlab tune``'s rounds on a separate store.  Both decide with the same paired rule at the same margin.
The items are quick.toml's passkey task with 20 items per length instead of 10: at ``max_drop`` 0.25,
Holm across 48 configs cannot show even a perfect config non-inferior on 20 items (lower end
-10.8 / 30.8 = -0.35), on 40 it can (-0.21).  It answers:

1. Is the tune's pick non-inferior in the grid's own verdict, and at least as compressed as the grid's
   sweet spot (or one grid step from it)?
2. What fraction of the grid's item evaluations did the tune use?  (goal: at most 40%)

Counts of evaluations do not depend on the machine's load; the wall times printed do.

Usage: python benchmarks/tune_bench.py [--lengths 1024,2048] [--items-per-length 20] [--max-drop 0.25]
       [--max-trials 24] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: kvlab from this checkout, imported below

from kvlab.core.experiment_spec import parse_spec  # noqa: E402
from kvlab.core.kv_config import KVCacheConfig  # noqa: E402
from kvlab.core.tune_spec import candidate_grid  # noqa: E402

SPACE = {"quant": ["none", "int8", "int4", "int2"], "group_sizes": [32, 128],
         "evict": ["none", "streaming_llm", "snapkv"], "budget": "ratio", "budget_range": [0.5, 0.75],
         "budget_step": 0.125}


def spec_data(args: argparse.Namespace) -> dict[str, Any]:
    return {"name": "tune-bench", "model": "smollm2-135m", "seed": 0, "max_drop": args.max_drop,
            "tasks": [{"name": "passkey", "context_lengths": args.lengths, "depths": [0.1, 0.3, 0.5, 0.7, 0.9],
                       "num_items": args.items_per_length}]}


def coordinates(config: KVCacheConfig, tune: Any) -> tuple[int, int, int, int]:
    """A config's position on the grid's axes: format, group size, method, budget (indices)."""
    budgets = tune.budgets()
    return (tune.quant.index(config.quant),
            tune.group_sizes.index(config.group_size) if config.quant.startswith("int") else 0,
            tune.evict.index(config.evict),
            budgets.index(config.ratio) if config.ratio is not None else 0)


def one_step(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Neighbours on the grid: equal on every axis but one, where they differ by one step."""
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True) if x != y]
    return diffs == [1]


def run_grid(spec_dict: dict[str, Any], configs: list[KVCacheConfig]) -> tuple[Any, float]:
    from kvlab.experiments.submit import InThisProcess, submit

    spec = parse_spec(spec_dict | {"configs": [c.model_dump(mode="json", exclude_defaults=True) for c in configs]})
    started = time.perf_counter()
    run = submit(spec, InThisProcess(progress=True)).handle
    return run, time.perf_counter() - started


def run_tune(spec_dict: dict[str, Any], args: argparse.Namespace) -> tuple[Any, float]:
    from kvlab.experiments.submit import submit
    from kvlab.tune.session import TuneHere

    spec = parse_spec(spec_dict | {"tune": SPACE | {"max_trials": args.max_trials, "min_items": args.min_items}})
    started = time.perf_counter()
    outcome = submit(spec, TuneHere(say=lambda line: print(f"  tune: {line}", file=sys.stderr))).handle
    return outcome, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 2048])
    parser.add_argument("--items-per-length", type=int, default=20)
    parser.add_argument("--max-drop", type=float, default=0.25)
    parser.add_argument("--max-trials", type=int, default=24)
    parser.add_argument("--min-items", type=int, default=4)
    parser.add_argument("--keep", type=Path, help="keep the two stores in this directory")
    args = parser.parse_args()
    spec_dict = spec_data(args)
    tune_space = parse_spec(spec_dict | {"tune": SPACE}).tune
    assert tune_space is not None
    grid = [KVCacheConfig(**point) for point in candidate_grid(tune_space)]
    n_items = len(args.lengths) * args.items_per_length
    print(f"space: {len(grid)} configs + the baseline, {n_items} items: "
          f"{(len(grid) + 1) * n_items} item evaluations as a grid", file=sys.stderr)
    work = args.keep or Path(tempfile.mkdtemp(prefix="kvlab-tune-bench-"))
    work.mkdir(parents=True, exist_ok=True)

    os.environ["KVLAB_DATABASE_URL"] = f"sqlite:///{work / 'grid.sqlite'}"
    grid_run, grid_s = run_grid(spec_dict, grid)
    summaries = {s.config_name: s for s in grid_run.summaries()}
    decision = grid_run.decision()
    grid_evals = len(grid_run.results)

    os.environ["KVLAB_DATABASE_URL"] = f"sqlite:///{work / 'tune.sqlite'}"
    outcome, tune_s = run_tune(spec_dict, args)
    answer = outcome.answer

    print(f"\n== tune vs grid (same items, seed and rule; max_drop {args.max_drop:.2f}) ==")
    spot = decision.sweet_spot
    spot_text = f"{spot.config_name} ({spot.physical_kv_bytes / 1e6:.2f} MB)" if spot else "none"
    print(f"grid: {len(grid)} configs x {n_items} items = {grid_evals} item evaluations in {grid_s:.0f} s; "
          f"sweet spot: {spot_text}")
    pick = answer.get("label")
    pick_text = f"{pick} ({answer['kv_bytes'] / 1e6:.2f} MB)" if pick else "none"
    print(f"tune: {answer['item_evals']} item evaluations in {tune_s:.0f} s "
          f"({answer['item_evals'] / grid_evals:.0%} of the grid's; goal <= 40%); pick: {pick_text}")
    if pick and spot:
        in_grid = summaries.get(pick)
        pick_config = KVCacheConfig(**answer["config"])
        spot_config = KVCacheConfig(**spot.config)
        non_inferior = bool(in_grid and in_grid.non_inferior)
        smaller = answer["kv_bytes"] <= spot.physical_kv_bytes * 1.0001
        near = one_step(coordinates(pick_config, tune_space), coordinates(spot_config, tune_space))
        print(f"the pick in the grid's verdict: {'non-inferior' if non_inferior else 'NOT non-inferior'} "
              f"(difference {in_grid.diff_estimate:+.3f} [{in_grid.diff_ci_low:+.3f}, {in_grid.diff_ci_high:+.3f}])"
              if in_grid else "the pick is not in the grid")
        print(f"as compressed as the grid's sweet spot: {'yes' if smaller else 'no'}; one grid step from it: "
              f"{'yes' if near else 'no' if pick != spot.config_name else 'it is the same config'}")
        ok = non_inferior and (smaller or near)
        print(f"question 1: {'YES' if ok else 'NO'}; question 2: {answer['item_evals'] / grid_evals:.0%} "
              f"{'<=' if answer['item_evals'] <= 0.4 * grid_evals else '>'} 40%")
    print(f"stores in {work}")


if __name__ == "__main__":
    main()
