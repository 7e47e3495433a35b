"""Batched decoding of an item's configs on the real default model: the same answers as each config alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvlab.core.geometry import CacheGeometry
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tasks import TaskSpec
from kvlab.engines.attention import MemberStates, kvlab_attention_forward
from kvlab.engines.batched_decode import MemberClock, batch_limit, member_bytes, token_kl
from kvlab.engines.embedded import EmbeddedEngine
from kvlab.tasks import generate_items

pytestmark = pytest.mark.model

#: A mixed group: baseline, three quantizations, eviction at two ratios, quantization plus eviction, a rotated
#: quantization.
GROUP = [
    KVCacheConfig(name="baseline"),
    KVCacheConfig(quant="int8"),
    KVCacheConfig(quant="int2"),
    KVCacheConfig(quant="fp8_e4m3"),
    KVCacheConfig(evict="streaming_llm", ratio=0.5),
    KVCacheConfig(evict="snapkv", ratio=0.875),
    KVCacheConfig(quant="int4", evict="snapkv", ratio=0.5),
    # kvlab's Hadamard rotation (4-bit blocks without a 16-bit window are too near their codes' rounding edges
    # for this test: a batched matmul's last bit flips a code now and then, 1e-3 nats on a token)
    KVCacheConfig(quant="int4", rotation=True),
]


@pytest.fixture(scope="module")
def alone(smollm) -> EmbeddedEngine:
    """The reference: every config decoded on its own (the path ``kvlab serve`` uses)."""
    return EmbeddedEngine(smollm, seed=0, max_batch=1)


@pytest.fixture(scope="module")
def items(engine) -> dict[str, TaskItem]:
    passkey = generate_items(TaskSpec(name="passkey", context_lengths=[320], depths=[0.5], num_items=1),
                             engine.tokenizer, seed=3)[0]
    perplexity = generate_items(TaskSpec(name="perplexity", context_lengths=[256], num_items=1),
                                engine.tokenizer, seed=1)[0]
    # a stop string too, so that members leave the batch at different steps for different reasons
    return {"passkey": TaskItem(**{**passkey.__dict__, "max_new_tokens": 8, "stop": (".",)}),
            "perplexity": perplexity}


@pytest.fixture(scope="module")
def reference(alone, items) -> dict[str, list]:
    return {name: list(alone.evaluate(item, GROUP)) for name, item in items.items()}


@pytest.mark.parametrize("max_batch", [None, 3])  # the whole group at once; sub-batches of 3, 3 and 1
def test_batched_greedy_ids_equal_each_config_alone(smollm, engine, items, reference, max_batch):
    batched = engine if max_batch is None else EmbeddedEngine(smollm, seed=0, max_batch=max_batch)
    results = list(batched.evaluate(items["passkey"], GROUP))
    expected = reference["passkey"]
    assert [r.config_name for r in results] == [r.config_name for r in expected]
    assert [r.generated for r in results] == [r.generated for r in expected]
    assert [r.output_tokens for r in results] == [r.output_tokens for r in expected]
    assert len({r.output_tokens for r in expected}) > 1  # members really left at different steps
    for ours, theirs in zip(results, expected, strict=True):  # each member's own cache, measured
        assert (ours.physical_kv_bytes, ours.peak_kv_bytes, ours.kept_tokens) == \
            (theirs.physical_kv_bytes, theirs.peak_kv_bytes, theirs.kept_tokens)
        assert ours.first_token_s > 0 and ours.ttft_s > ours.first_token_s


def test_batched_perplexity_equals_each_config_alone(engine, items, reference):
    results = list(engine.evaluate(items["perplexity"], GROUP))
    expected = reference["perplexity"]
    # Equal up to float32 rounding: a batched matmul rounds differently from a single one, by each CPU's own
    # kernels (1e-5 of the summed NLL on one machine, 4e-5 on an AVX-512 one); a member decoded from
    # another's cache would be off by its config's own effect (int2, eviction: nats).
    tolerance = 1e-4
    for ours, theirs in zip(results, expected, strict=True):
        assert ours.nll_tokens == theirs.nll_tokens
        assert ours.nll == pytest.approx(theirs.nll, rel=tolerance), ours.config_name


def _same_fidelity(ours, theirs) -> None:
    """Per token: KL equal up to float32 rounding, the same top-1 verdicts.  A batched matmul rounds
    differently from a single one (logits ~1e-4 apart: up to 3e-4 nats measured on one machine, 2.2e-3
    at a KL of 2 nats on an AVX-512 one); a token out of place would be off by the KL itself (0.01 to 3
    nats here)."""
    assert (ours is None) == (theirs is None)
    if ours is not None:
        assert ours.kl == pytest.approx(theirs.kl, rel=3e-3, abs=1e-3) and ours.agree == theirs.agree


@pytest.mark.parametrize("kind", ["passkey", "perplexity"])
@pytest.mark.parametrize("max_batch", [None, 3])
def test_fidelity_is_the_same_batched_in_sub_batches_and_alone(smollm, engine, items, reference, kind, max_batch):
    """Alone (max_batch=1) every config is compared with the baseline's finished run (a Reference);
    batched, with the baseline decoded in the same batch: the same figures either way."""
    batched = engine if max_batch is None else EmbeddedEngine(smollm, seed=0, max_batch=max_batch)
    results = list(batched.evaluate(items[kind], GROUP))
    assert results[0].fidelity is None  # the baseline is the reference
    diverged = 0
    for ours, theirs in zip(results[1:], reference[kind][1:], strict=True):
        _same_fidelity(ours.fidelity, theirs.fidelity)
        diverged += ours.fidelity.first_divergence is not None
    assert diverged >= 2  # the teacher-forced copies really ran


def test_a_group_without_the_baseline_is_still_measured_against_it(engine, items, reference):
    """A worker holding only some configs decodes the baseline anyway, and does not report it."""
    results = list(engine.evaluate(items["passkey"], GROUP[1:]))
    assert [r.config_name for r in results] == [r.config_name for r in reference["passkey"][1:]]
    for ours, theirs in zip(results, reference["passkey"][1:], strict=True):
        _same_fidelity(ours.fidelity, theirs.fidelity)
        assert ours.generated == theirs.generated


def test_teacher_forcing_after_a_divergence_attends_as_a_token_by_token_decode(smollm, engine, items):
    """A diverged config's cache copy is fed the baseline's remaining tokens in chunks that end where a
    quantized layer moves its tail into codes: the same KL as feeding them one by one (and different
    from one unsplit pass, which would let earlier tokens see codes they never saw)."""
    from kvlab.engines.batched_decode import Reference, _ReferenceRun, _teacher_force, _Trace, _Twin

    config = KVCacheConfig(quant="int2", group_size=32, residual_length=0)
    tokens = engine._encode(items["passkey"].context, special=True)
    prefix = tokens[:32 * (len(tokens) // 32) - 3]  # 29 tokens in the 16-bit tail: the 3rd token fed flushes
    prefill = engine._prefill(prefix, set())
    fed = tokens[len(prefix):len(prefix) + 7]

    def cache():
        return engine._compress(config, [None] * len(prefill.keys), prefill.keys, prefill.values, len(prefix),
                                len(prefix)).cache

    reference_logprobs = torch.log_softmax(torch.randn(len(fed) + 1, smollm.model.config.vocab_size,
                                                       generator=torch.Generator().manual_seed(1)), dim=-1)
    ref = _ReferenceRun(Reference(fed + [0], reference_logprobs, "test"), "test")

    def forced(unsplit: bool) -> list[float]:
        trace, twin = _Trace(), _Twin(0, cache(), 0, len(prefix))
        assert twin.cache.tokens_before_flush() == 2  # 30 and 31 tokens in the tail; the 32nd flushes
        if unsplit:
            twin.cache.tokens_before_flush = lambda: None
        with torch.no_grad():
            _teacher_force(smollm.model, twin, ref, trace, torch.device("cpu"))
        return trace.kl

    stepwise, one_by_one = cache(), []
    with torch.no_grad():
        for i, token in enumerate(fed):
            logits = smollm.model(input_ids=torch.tensor([[token]]), past_key_values=stepwise,
                                  position_ids=torch.tensor([[len(prefix) + i]])).logits[0, -1]
            one_by_one.append(token_kl(reference_logprobs[i + 1], logits).item())
    # float32 rounding of a chunk against single steps: 3e-4 of the KL measured (against a random
    # reference, KLs of 7-10 nats); one unsplit pass is off by 0.15-1.2 nats
    assert forced(unsplit=False) == pytest.approx(one_by_one, rel=1e-3)
    assert forced(unsplit=True) != pytest.approx(one_by_one, rel=1e-2)


def test_attention_runs_each_member_against_its_own_cache():
    """Two members with caches of different lengths: each output row equals that member attended alone."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 9, 1, 64, generator=generator)
    keys = [torch.randn(1, 3, n, 64, generator=generator) for n in (40, 17)]
    values = [torch.randn(1, 3, n, 64, generator=generator) for n in (40, 17)]
    clock = MemberClock(2, torch.device("cpu"))
    module = SimpleNamespace()
    output, _ = kvlab_attention_forward(module, query, MemberStates(keys, clock), MemberStates(values, clock), None)
    for b in range(2):
        alone, _ = kvlab_attention_forward(module, query[b:b + 1], keys[b], values[b], None)
        assert torch.equal(output[b:b + 1], alone)
    assert all(seconds > 0 for seconds in clock.seconds)


def test_batch_limit_from_memory_by_hand():
    # smollm2-135m: 30 layers, 3 KV heads, head_dim 64, vocabulary 49152, float32
    geometry = CacheGeometry(num_layers=30, num_kv_heads=3, head_dim=64, layer_windows=(None,) * 30)
    per_member = member_bytes(geometry, tokens=1000, fed_tokens=1, vocab_size=49152, compute_bytes=4)
    # 16-bit cache 30 x 2 x 3 x 64 x 1000 x 2 B + its blocks' fp32 floats kept for the decode (twice that)
    # + 2 rebuilt fp32 layers 2 x 3 x 64 x 1000 x 4 B + 2 x 49152 x 4 B
    assert per_member == 23_040_000 + 46_080_000 + 3_072_000 + 393_216
    assert batch_limit(per_member, free=10 * per_member) == 5  # half the free memory
    assert batch_limit(per_member, free=per_member) == 1  # never fewer than one
