"""The embedded engine on the real default model: bytes, eviction budgets, determinism."""

from __future__ import annotations

import itertools

import pytest

from kvlab.core.formats import KVLAB_QUANT_NAMES
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import EVICTION_METHODS, KVCacheConfig
from kvlab.core.results import MEASURED_EMBEDDED
from kvlab.core.tasks import TaskSpec
from kvlab.tasks import generate_items, score_item

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def item(engine):
    """One short passkey item, answer generation capped at 3 tokens to keep the sweep fast."""
    full = generate_items(TaskSpec(name="passkey", context_lengths=[320], depths=[0.5], num_items=1),
                          engine.tokenizer, seed=3)[0]
    return TaskItem(**{**full.__dict__, "max_new_tokens": 3})


def _configs_for_every_combination() -> list[KVCacheConfig]:
    return [KVCacheConfig(quant=q, evict=e, ratio=None if e == "none" else 0.5)
            for q, e in itertools.product(KVLAB_QUANT_NAMES, EVICTION_METHODS)]  # kvlab cache formats


def test_physical_bytes_match_analytic_for_every_quantization_and_eviction(engine, item):
    configs = _configs_for_every_combination() + [
        KVCacheConfig(quant="int4", evict="knorm", threshold=0.4),
        KVCacheConfig(quant="int2", evict="snapkv", keep_fraction=0.25, query_aware=True),
        KVCacheConfig(quant="int8", group_size=128, residual_length=0, key_axis="token"),
    ]
    results = list(engine.evaluate(item, configs))
    assert len(results) == len(configs)
    for result in results:
        assert abs(result.physical_kv_bytes / result.analytic_kv_bytes - 1) <= 0.01, result.config_name
        assert result.peak_kv_bytes >= result.physical_kv_bytes  # decoding only adds tokens
        assert (result.kv.source, result.kv.estimated) == (MEASURED_EMBEDDED, False)
        assert result.kv.compression_ratio == result.compression_ratio
    by_name = {r.config_name: r for r in results}
    baseline = by_name["baseline"]
    assert baseline.physical_kv_bytes == baseline.baseline_kv_bytes  # 16-bit, nothing dropped: 1.00x
    # more compression, fewer bytes: int8 > int4 > int2, and eviction halves what quantization keeps
    sizes = [by_name[n].physical_kv_bytes for n in ("baseline", "int8/g64/r64", "int4/g64/r64", "int2/g64/r64")]
    assert sizes == sorted(sizes, reverse=True)
    assert by_name["snapkv:r0.5"].physical_kv_bytes < 0.52 * baseline.physical_kv_bytes


@pytest.mark.parametrize("config, expected_kept", [
    (KVCacheConfig(evict="snapkv", ratio=0.75), 0.25),
    (KVCacheConfig(evict="tova", keep_fraction=0.4), 0.4),
    (KVCacheConfig(evict="streaming_llm", ratio=0.5), 0.5),
    (KVCacheConfig(evict="knorm", threshold=0.3), 0.7),
])
def test_eviction_budgets(engine, item, config, expected_kept):
    result = next(engine.evaluate(item, [config]))
    assert result.kept_fraction == pytest.approx(expected_kept, abs=0.03)
    assert result.compression_ratio == pytest.approx(1 / expected_kept, rel=0.1)


def test_query_aware_keeps_the_question(engine, item):
    agnostic, aware = engine.evaluate(item, [KVCacheConfig(evict="snapkv", ratio=0.75),
                                             KVCacheConfig(evict="snapkv", ratio=0.75, query_aware=True)])
    question_tokens = len(engine.tokenizer(item.question, add_special_tokens=False)["input_ids"])
    assert aware.context_tokens == agnostic.context_tokens + question_tokens - 1
    assert aware.kept_fraction == pytest.approx(0.25, abs=0.01)
    assert aware.kept_tokens == pytest.approx(agnostic.kept_tokens + question_tokens - 1, abs=1)


def test_baseline_answers_passkey_and_scores(engine):
    items = generate_items(TaskSpec(name="passkey", context_lengths=[512], depths=[0.2, 0.8], num_items=2),
                           engine.tokenizer, seed=0)
    results = [next(engine.evaluate(it, [KVCacheConfig()])) for it in items]
    assert [score_item(it, r.generated) for it, r in zip(items, results, strict=True)] == [1.0, 1.0]
    for r in results:
        assert r.ttft_s > r.prefill_s > 0 and r.output_tokens >= 2 and r.tpot_s > 0


def test_perplexity_rises_under_heavy_quantization(engine):
    item = generate_items(TaskSpec(name="perplexity", context_lengths=[320], num_items=1, continuation_tokens=32),
                          engine.tokenizer, seed=0)[0]
    all_2bit = KVCacheConfig(quant="int2", residual_length=0, group_size=32)
    aware = KVCacheConfig(evict="snapkv", ratio=0.5, query_aware=True)  # no question: the agnostic layout
    baseline, crushed, aware_result = engine.evaluate(item, [KVCacheConfig(), all_2bit, aware])
    assert aware_result.config_name == aware.label and aware_result.nll_tokens == baseline.nll_tokens
    assert baseline.nll_tokens == crushed.nll_tokens >= 30  # retokenized apart from the context: +-1
    assert crushed.nll > baseline.nll > 0


def test_same_item_same_seed_same_result(engine, item):
    configs = [KVCacheConfig(quant="int4", evict="random", ratio=0.5), KVCacheConfig(evict="snapkv", ratio=0.5)]
    first = [(r.generated, r.physical_kv_bytes, r.kept_tokens) for r in engine.evaluate(item, configs)]
    second = [(r.generated, r.physical_kv_bytes, r.kept_tokens) for r in engine.evaluate(item, configs)]
    assert first == second


def test_shared_prefill_gives_the_same_answers_as_separate_runs(engine, item):
    configs = [KVCacheConfig(), KVCacheConfig(quant="int4"), KVCacheConfig(evict="snapkv", ratio=0.5)]
    together = [r.generated for r in engine.evaluate(item, configs)]
    alone = [next(engine.evaluate(item, [c])).generated for c in configs]
    assert together == alone


def test_one_prefill_serves_both_layouts_where_the_agnostic_configs_need_no_scores(engine, monkeypatch):
    """The playground's ``share_prefill``: the query-agnostic configs read the query-aware prefill cut at the
    context's end (causal: the same keys and values up to float rounding), so both layouts give what they give
    apart, from one prefill whose time both are charged; the query-aware configs are measured against the
    query-agnostic baseline's run, so no second baseline decodes."""
    from kvlab.engines import embedded
    from kvlab.engines.embedded_session import SessionModes

    item = generate_items(TaskSpec(name="passkey", context_lengths=[512], depths=[0.5], num_items=1),
                          engine.tokenizer, seed=0)[0]
    configs = [KVCacheConfig(), KVCacheConfig(quant="int4"), KVCacheConfig(evict="streaming_llm", ratio=0.5),
               KVCacheConfig(evict="snapkv", ratio=0.5, query_aware=True)]
    members: list[int] = []

    def counted(model, caches, *args, **kwargs):
        members.append(len(caches))
        return decode_batch(model, caches, *args, **kwargs)

    decode_batch = embedded.decode_batch
    monkeypatch.setattr(embedded, "decode_batch", counted)
    apart = list(engine.evaluate(item, configs))
    assert members == [3, 2]  # the query-aware layout decodes a baseline of its own, not reported
    with engine.session(SessionModes(share_prefill=True)):
        members.clear()
        shared = list(engine.evaluate(item, configs))
        assert members == [3, 1]
        scored = list(engine.evaluate(item, [KVCacheConfig(evict="snapkv", ratio=0.5), configs[-1]]))
    assert [r.generated for r in shared] == [r.generated for r in apart]
    for one, other in zip(shared, apart, strict=True):
        assert (one.physical_kv_bytes, one.kept_tokens, one.context_tokens) == (
            other.physical_kv_bytes, other.kept_tokens, other.context_tokens), one.config_name
        if one.extra.get("fidelity"):
            assert one.extra["fidelity"]["mean_kl"] == pytest.approx(other.extra["fidelity"]["mean_kl"], abs=1e-3)
    assert len({r.prefill_s for r in shared}) == 1  # one prefill, charged to every config
    assert len({r.prefill_s for r in apart}) == 2
    assert scored[0].prefill_s != scored[1].prefill_s  # an agnostic scorer needs its own prefill
