"""Head-wise budgets (AdaKV, CriticalAdaKV) against kvpress's own presses, on a freshly loaded model.

kvpress keeps every head's full keys and values and masks the entries a head-wise press evicts
with fake keys (its attention patch); kvlab keeps each head's kept entries only
(:class:`kvlab.compress.cache.HeadwiseLayer`) and masks nothing but padding.  On the same token
ids the generated text must be identical, while kvlab's measured bytes are the kept entries' and
kvpress's cache still holds every token of the context.
"""

from __future__ import annotations

import pytest
from kvpress.utils import compute_n_kept
from transformers import DynamicCache

from kvlab.compress.accounting import BASELINE_BYTES_PER_ELEMENT
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tasks import TaskSpec
from kvlab.tasks import generate_items
from tests.compress.reference import kvpress_answer

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def engine(parity_engine):
    """This module's engine: each item's configs decoded together, no fidelity baseline added."""
    return parity_engine


@pytest.fixture(scope="module")
def items(engine):
    passkeys = generate_items(TaskSpec(name="passkey", context_lengths=[1024], num_items=2), engine.tokenizer, seed=0)
    # the recall answer cut at 48 tokens: kvpress's reference decodes it once per config
    recall = generate_items(TaskSpec(name="recall", context_lengths=[512], num_items=1, max_new_tokens=48),
                            engine.tokenizer, seed=3)
    return passkeys + recall


def _kvpress_press(config: KVCacheConfig):
    import kvpress

    from kvlab.compress.eviction import press_class
    from kvlab.core.methods import HEAD_BUDGETS, METHODS

    scorer = press_class(METHODS[config.evict])()
    wrapper = getattr(kvpress, HEAD_BUDGETS[config.heads].press)
    press = wrapper(press=scorer, alpha_safeguard=config.alpha_safeguard)
    press.compression_ratio = config.ratio
    return press


CONFIGS = {
    "adakv_snapkv": KVCacheConfig(evict="snapkv", ratio=0.75, heads="adakv"),
    "critical_adakv_snapkv": KVCacheConfig(evict="snapkv", ratio=0.75, heads="critical_adakv"),
    "adakv_knorm": KVCacheConfig(evict="knorm", ratio=0.5, heads="adakv"),
    "adakv_keydiff_safeguard": KVCacheConfig(evict="keydiff", ratio=0.6, heads="adakv", alpha_safeguard=0.5),
    "critical_adakv_expected": KVCacheConfig(evict="expected_attention", ratio=0.7, heads="critical_adakv"),
}


@pytest.fixture(scope="module")
def kvlab_results(engine, items) -> dict[str, list]:
    """kvlab's results of every config, per item in ``items`` (each item's configs decoded together)."""
    by_name: dict[str, list] = {name: [] for name in CONFIGS}
    for item in items:
        for name, result in zip(CONFIGS, engine.evaluate(item, list(CONFIGS.values())), strict=True):
            assert result.config_name == CONFIGS[name].label
            by_name[name].append(result)
    return by_name


@pytest.mark.parametrize("name", CONFIGS)
def test_text_matches_kvpress_while_only_kept_entries_are_held(engine, kvpress_pipeline, items, kvlab_results, name):
    config = CONFIGS[name]
    per_entry = 2 * engine.geometry.head_dim * BASELINE_BYTES_PER_ELEMENT  # K and V of one token in one head
    ragged = False
    for item, ours in zip(items, kvlab_results[name], strict=True):
        their_cache = DynamicCache()  # kvpress's: every token of the context, evicted ones masked
        theirs = kvpress_answer(kvpress_pipeline, engine.tokenizer, item, _kvpress_press(config), ours.output_tokens,
                                cache=their_cache)
        assert ours.generated == theirs, (name, item.item_id)
        kept = ours.extra["cache_layout"]["kept"]
        ragged |= any(len(set(heads)) > 1 for heads in kept)
        # kvlab holds the kept entries, 16-bit: its bytes by hand, per layer and in all
        assert ours.extra["cache_layout"]["bytes"] == [sum(heads) * per_entry for heads in kept]
        assert ours.physical_kv_bytes == sum(map(sum, kept)) * per_entry == ours.analytic_kv_bytes
        # each layer keeps the heads' mean budget in all; kvpress's cache still holds the whole context
        n_kept = compute_n_kept(ours.context_tokens, config.ratio)
        assert all(sum(heads) == n_kept * len(heads) for heads in kept)
        assert their_cache.get_seq_length() == ours.context_tokens
        assert ours.physical_kv_bytes < 0.55 * engine.geometry.baseline_bytes(ours.context_tokens)
    assert ragged, f"{name}: every head kept the same count on every layer: not head-wise"


def test_headwise_bytes_fall_with_the_budget_and_the_safeguard_holds(engine, items):
    item = items[0]
    configs = [KVCacheConfig(evict="snapkv", keep_tokens=n, heads="adakv", quant=quant)
               for n in (400, 200, 100) for quant in ("none", "int4")]
    results = list(engine.evaluate(item, configs))
    for quant in ("none", "int4"):
        sizes = [r.physical_kv_bytes for r in results if r.config["quant"] == quant]
        assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 3
    for result in results:
        assert result.physical_kv_bytes == result.analytic_kv_bytes  # per head laid out on its own
        n = result.config["keep_tokens"]
        for heads in result.extra["cache_layout"]["kept"]:
            assert min(heads) >= int(n * 0.2)  # kvpress's default alpha_safeguard of an equal share
            assert sum(heads) == n * len(heads)


def test_a_query_aware_headwise_config_keeps_the_question_in_every_head(engine, items):
    item = items[0]
    plain, aware = engine.evaluate(item, [KVCacheConfig(evict="knorm", keep_tokens=64, heads="adakv"),
                                          KVCacheConfig(evict="knorm", keep_tokens=64, heads="adakv",
                                                        query_aware=True)])
    question = aware.context_tokens - plain.context_tokens
    assert question > 0
    for heads in aware.extra["cache_layout"]["kept"]:
        assert min(heads) >= question + 1 and sum(heads) == 64 * len(heads)


KVZIP = {"kvzip_50": KVCacheConfig(evict="kvzip", ratio=0.5), "kvzip_75": KVCacheConfig(evict="kvzip", ratio=0.75)}




@pytest.fixture(scope="module")
def kvzip_results(engine, items) -> dict[str, list]:
    """Per KVzip config, on the two passkey items: (SnapKV at its ratio, KVzip) results, all four configs of an
    item in one evaluation (one prefill; the replay scores are the same at either ratio)."""
    by_name: dict[str, list] = {name: [] for name in KVZIP}
    for item in items[:2]:
        configs = [c for config in KVZIP.values() for c in (KVCacheConfig(evict="snapkv", ratio=config.ratio), config)]
        results = list(engine.evaluate(item, configs))
        for index, name in enumerate(KVZIP):
            by_name[name].append(results[2 * index:2 * index + 2])
    return by_name


@pytest.mark.parametrize("name", KVZIP)
def test_kvzip_matches_kvpress_and_charges_its_replay_to_itself(engine, kvpress_pipeline, items, kvzip_results,
                                                                name):
    """KVzip (kvpress's own replay of the context, its one budget shared across every layer and head): the same
    text as kvpress's masked version, the kept entries' bytes only, and the replay's seconds in its own scorer time."""
    from kvpress import KVzipPress

    config = KVZIP[name]
    per_entry = 2 * engine.geometry.head_dim * BASELINE_BYTES_PER_ELEMENT
    for item, (snap, ours) in zip(items[:2], kvzip_results[name], strict=True):
        assert (snap.config_name, ours.config_name) == (KVCacheConfig(evict="snapkv", ratio=config.ratio).label,
                                                        config.label)
        theirs = kvpress_answer(kvpress_pipeline, engine.tokenizer, item, KVzipPress(compression_ratio=config.ratio),
                                ours.output_tokens)
        assert ours.generated == theirs, (name, item.item_id)
        kept = ours.extra["cache_layout"]["kept"]
        assert len({sum(heads) for heads in kept}) > 1  # layers keep different counts: one budget for all
        total = sum(map(sum, kept))
        assert total == pytest.approx(len(kept) * len(kept[0]) * ours.context_tokens * (1 - config.ratio), abs=1)
        assert ours.physical_kv_bytes == total * per_entry == ours.analytic_kv_bytes
        # the replay is charged to KVzip alone: the prefill is the same for both configs, SnapKV's scorer is its own
        assert ours.prefill_s == snap.prefill_s and ours.score_s > ours.prefill_s > snap.score_s
