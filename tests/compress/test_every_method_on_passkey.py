"""Every registered eviction method runs on the real default model: ratio 0.5 on passkey items.

This test is what ``checked_on_default_model`` in :mod:`kvlab.core.methods` means: the flag
is True exactly for the methods run here.  All methods of an item share one prefill (one
``engine.evaluate`` call), so the whole check is a few prefills.
"""

from __future__ import annotations

import pytest
import torch

from kvlab.compress.eviction import scorer_key
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.methods import METHODS
from kvlab.core.tasks import TaskSpec
from kvlab.tasks import generate_items

pytestmark = pytest.mark.model

CHECKED = tuple(METHODS)  # every registered method


def test_the_flag_marks_exactly_the_methods_checked_here():
    assert {name for name, m in METHODS.items() if m.checked_on_default_model} == set(CHECKED)


def test_every_method_keeps_half_the_context_at_ratio_one_half(engine):
    items = generate_items(TaskSpec(name="passkey", context_lengths=[512], depths=[0.3, 0.7], num_items=2),
                           engine.tokenizer, seed=5)
    configs = [KVCacheConfig(evict=name, ratio=0.5) for name in CHECKED]
    for full in items:
        item = TaskItem(**{**full.__dict__, "max_new_tokens": 2})  # the test is about eviction, not answers
        results = {r.config_name: r for r in engine.evaluate(item, configs)}
        assert set(results) == {c.label for c in configs}
        for config in configs:
            result = results[config.label]
            assert result.error is None, (config.evict, result.error)
            # PyramidKV shifts budget between layers around the same mean
            assert result.kept_fraction == pytest.approx(0.5, abs=0.03), config.evict


def test_presses_drawing_random_sketches_score_reproducibly(engine):
    keys = {scorer_key(KVCacheConfig(evict=name, ratio=0.5)) for name, m in METHODS.items() if m.global_rng}
    first = engine._prefill(list(range(100, 400)), keys).collected.scores
    torch.manual_seed(123)  # kvlab seeds these presses itself: the global state must not matter
    second = engine._prefill(list(range(100, 400)), keys).collected.scores
    for key in keys:
        assert all(torch.equal(a, b) for a, b in zip(first[key], second[key], strict=True) if a is not None), key
