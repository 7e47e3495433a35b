"""Fidelity's cost: the embedded engine's sweep with fidelity measured and without, side by side.

The same items and configs (examples/quick.toml's by default) through
  fidelity  ``EmbeddedEngine(loaded, fidelity=True)``: every config compared token by token with
            the baseline decoded in the same batch (a copy of a config's cache kept where its
            greedy output leaves the baseline's, then fed the baseline's tokens in one pass);
  without   ``EmbeddedEngine(loaded, fidelity=False)``: the path before fidelity,
two engines on one loaded model (each installs the same kvlab attention on it, which is idempotent,
and keeps its own state), alternating per item A B B A ... so that the machine's load hits both
alike, after --warmup untimed items through each.  Prints each item's wall seconds, the totals and
their ratio (fidelity / without), the wall seconds of each phase (prefill; compression; decoding,
with fidelity's comparisons and teacher forcing), and how many (item, config) answers the two
engines generated alike.  The load average is printed first and last: a busy machine adds to both.

Usage: python benchmarks/fidelity_cost.py [--spec examples/quick.toml] [--limit 4] [--warmup 1] [--json OUT]
(run it under `flock /tmp/kvlab-bench.lock`: benchmarks must not overlap)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvlab.threads import share_cores

share_cores()  # before torch loads (kvlab/threads.py): the machine is shared

from kvlab.engines.embedded import EmbeddedEngine  # noqa: E402
from kvlab.experiments.runner import build_items, interleave  # noqa: E402
from kvlab.models import load_model  # noqa: E402
from kvlab.spec_files import load_spec  # noqa: E402

PHASES = ("prefill", "compress", "decode")
ENGINES = ("fidelity", "without")


class PhaseTimedEngine(EmbeddedEngine):
    """An embedded engine that adds up the wall seconds of its phases (its private steps, wrapped)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.seconds = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def _prefill(self, *args: Any, **kwargs: Any) -> Any:
        with self._timed("prefill"):
            return super()._prefill(*args, **kwargs)

    def _compress(self, *args: Any, **kwargs: Any) -> Any:
        with self._timed("compress"):
            return super()._compress(*args, **kwargs)

    def _decode(self, item: Any, configs: list, *args: Any, **kwargs: Any) -> Any:
        """Its compression is counted apart, by :meth:`_compress`."""
        phase = "decode"
        compressing = self.seconds["compress"]
        with self._timed(phase):
            outcome = super()._decode(item, configs, *args, **kwargs)
        self.seconds[phase] -= self.seconds["compress"] - compressing
        return outcome


for _step in ("_prefill", "_compress", "_decode"):  # a rename in the engine must not zero a phase silently
    assert callable(getattr(EmbeddedEngine, _step, None)), f"EmbeddedEngine has no {_step} any more"


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="examples/quick.toml")
    parser.add_argument("--limit", type=int, default=4, help="items (interleaved over task and context length)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed items through each engine first")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the figures as JSON")
    args = parser.parse_args()
    spec, warnings = load_spec(args.spec)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    configs = spec.all_configs()
    loaded = load_model(spec.model)
    engines = {"fidelity": PhaseTimedEngine(loaded, seed=spec.seed, fidelity=True),
               "without": PhaseTimedEngine(loaded, seed=spec.seed, fidelity=False)}
    for engine in engines.values():
        engine.check_configs(configs)
    items = interleave(build_items(spec, loaded.tokenizer))
    timed = items[:args.limit]
    engines["fidelity"].check_items(timed)
    print(f"{spec.name}: {len(configs)} configs x {len(timed)} items on {spec.model} ({loaded.device}, "
          f"{loaded.dtype}); load average {load()}", flush=True)
    for item in items[:args.warmup]:
        for engine in engines.values():
            list(engine.evaluate(item, configs))
    for engine in engines.values():
        engine.seconds = dict.fromkeys(PHASES, 0.0)

    walls = {name: 0.0 for name in ENGINES}
    generated: dict[str, dict[tuple[str, str], str]] = {name: {} for name in ENGINES}
    per_item = []
    for index, item in enumerate(timed):
        order = ENGINES if index % 2 == 0 else ENGINES[::-1]  # A B, B A, A B, ...
        seconds = {}
        for name in order:
            start = time.perf_counter()
            results = list(engines[name].evaluate(item, configs))
            seconds[name] = time.perf_counter() - start
            walls[name] += seconds[name]
            generated[name].update({(r.item_id, r.config_name): r.generated for r in results})
        per_item.append({"item": item.item_id, "first": order[0], **seconds})
        print(f"  {item.item_id:32} fidelity {seconds['fidelity']:6.1f} s   without {seconds['without']:6.1f} s   "
              f"({order[0]} first)", flush=True)

    ratio = walls["fidelity"] / walls["without"]
    print(f"wall: fidelity {walls['fidelity']:.1f} s, without {walls['without']:.1f} s: fidelity / without "
          f"{ratio:.2f}x ({(ratio - 1):+.0%})")
    print("phases, wall seconds (fidelity | without):")
    for phase in PHASES:
        print(f"  {phase:16} {engines['fidelity'].seconds[phase]:7.1f} | {engines['without'].seconds[phase]:7.1f}")
    pairs = generated["fidelity"].keys()
    alike = sum(generated["fidelity"][key] == generated["without"].get(key) for key in pairs)
    print(f"same generated text: {alike} of {len(pairs)} (item, config) pairs; load average {load()}")
    if args.json:
        args.json.write_text(json.dumps({
            "spec": args.spec, "configs": len(configs), "items": per_item, "wall_s": walls, "ratio": ratio,
            "phases_s": {name: engine.seconds for name, engine in engines.items()},
            "same_generated": alike, "pairs": len(pairs)}, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
