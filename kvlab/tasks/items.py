"""What every task generator shares about its items: a private random generator per item, a depth's label."""

from __future__ import annotations

import random


def item_rng(seed: int, item_id: str) -> random.Random:
    """A generator private to one item: same (seed, item_id), same item, whatever else
    the spec asks for; string seeds are hashed with SHA-512, so stable across processes."""
    return random.Random(f"{seed}:{item_id}")


def depth_label(depth: float) -> str:
    """``0.5`` -> ``"0.50"``; more digits only when two decimals would lose precision."""
    short = f"{depth:.2f}"
    return short if float(short) == depth else repr(depth)
