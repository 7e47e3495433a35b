"""One context, many questions: a shared context (prefilled and compressed once) against each question
evaluated alone (its own prefill and compression), side by side on the same items and configs.

The items of a spec whose tasks ask several questions per context (examples/shared_context.toml by
default) through one engine:
  shared  ``EmbeddedEngine.evaluate_many``: each context prefilled and compressed once, every
          question decoded from a copy of its compressed cache;
  alone   ``EmbeddedEngine.evaluate`` per question: the path of a one-question task;
alternating per context (shared, alone, alone, shared, ...) so that the machine's load hits both
alike, after one untimed context through each.  Prints each context's wall seconds, the totals and
their ratio (alone / shared), and how many (question, config) answers the two generated alike: in the
independent mode every answer must be the same (each question starts from the same compressed cache).

Usage: python benchmarks/shared_context_bench.py [--spec examples/shared_context.toml] [--contexts 4] [--json OUT]
(run it under `flock /tmp/kvlab-bench.lock`: benchmarks must not overlap)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from itertools import groupby
from pathlib import Path

from kvlab.threads import share_cores

share_cores()  # before torch loads (kvlab/threads.py): the machine is shared

from kvlab.engines.embedded import EmbeddedEngine  # noqa: E402
from kvlab.experiments.runner import build_items  # noqa: E402
from kvlab.models import load_model  # noqa: E402
from kvlab.spec_files import load_spec  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="examples/shared_context.toml")
    parser.add_argument("--contexts", type=int, default=4, help="timed contexts (after one untimed)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    spec, _ = load_spec(args.spec)
    engine = EmbeddedEngine(load_model(spec.model), seed=spec.seed)
    configs = spec.all_configs()
    items = build_items(spec, engine.tokenizer)
    contexts = [list(group) for _, group in groupby(items, key=lambda item: item.context_id)]
    if len(contexts) < args.contexts + 1 or any(len(c) < 2 for c in contexts):
        raise SystemExit(f"{args.spec}: needs {args.contexts + 1} contexts of several questions each")
    print(f"load average {os.getloadavg()[0]:.2f}; {len(configs)} configs, {len(contexts[0])} questions per context")

    def shared(questions):
        return {(i.item_id, r.config_name): r.generated
                for i, r in engine.evaluate_many([(q, configs) for q in questions])}

    def alone(questions):
        return {(i.item_id, r.config_name): r.generated for i in questions for r in engine.evaluate(i, configs)}

    runs = {"shared": shared, "alone": alone}
    for run in runs.values():  # warm-up
        run(contexts[0])
    seconds = {name: 0.0 for name in runs}
    answers: dict[str, dict] = {name: {} for name in runs}
    for index, questions in enumerate(contexts[1:args.contexts + 1]):
        order = list(runs) if index % 2 == 0 else list(reversed(runs))
        took = {}
        for name in order:
            start = time.perf_counter()
            answers[name] |= runs[name](questions)
            took[name] = time.perf_counter() - start
            seconds[name] += took[name]
        print(f"context {questions[0].context_id}: shared {took['shared']:.1f} s, alone {took['alone']:.1f} s")
    same = sum(answers["shared"][key] == text for key, text in answers["alone"].items())
    ratio = seconds["alone"] / seconds["shared"]
    print(f"total: shared {seconds['shared']:.1f} s, alone {seconds['alone']:.1f} s; alone / shared = {ratio:.2f}x")
    print(f"same answers: {same}/{len(answers['alone'])}; load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"seconds": seconds, "ratio": ratio, "same": same,
                                         "answers": len(answers["alone"])}, indent=2))
    return 0 if same == len(answers["alone"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
