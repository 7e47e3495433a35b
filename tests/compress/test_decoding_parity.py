"""Compression during generation against kvpress's own ``DecodingPress``, on a freshly loaded model.

As ``test_kvpress_parity.py`` for the prompt: kvpress runs on its own copy of SmolLM2 (its hooks,
its DynamicCache, its greedy loop), kvlab's engine on the same token ids with the same policy, on a
recall item whose answer is long enough for the cache to be cut several times while it is written.
The generated text must be identical.  Also: a batch of policies decodes as each alone does, and
the bytes over the generation are measured, fall at each compression, and are stated against the
uncompressed cache of the same tokens.
"""

from __future__ import annotations

import pytest

from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tasks import TaskSpec
from kvlab.engines.embedded import EmbeddedEngine
from kvlab.tasks import generate_items
from tests.compress.reference import kvpress_answer

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def recall_item(engine):
    item = generate_items(TaskSpec(name="recall", context_lengths=[512], num_items=1), engine.tokenizer, seed=3)[0]
    assert item.max_new_tokens >= 100  # long enough for several compressions below
    return item


def _kvpress_press(config: KVCacheConfig):
    import kvpress

    from kvlab.compress.eviction import press_class
    from kvlab.core.methods import METHODS

    decode = config.decode
    base = press_class(METHODS[config.evict])()
    common = {"base_press": base, "compression_interval": decode.interval, "hidden_states_buffer_size": decode.buffer}
    if decode.ratio is not None:
        decoding = kvpress.CompressionRatioDecodingPress(target_compression_ratio=decode.ratio, **common)
    else:
        decoding = kvpress.DecodingPress(target_size=decode.target_tokens, **common)
    if config.ratio is None:
        return decoding
    prefill = press_class(METHODS[config.evict])(compression_ratio=config.ratio)
    return kvpress.PrefillDecodingPress(prefilling_press=prefill, decoding_press=decoding)


CONFIGS = {
    "streaming_llm": KVCacheConfig(evict="streaming_llm", decode={"interval": 32, "target_tokens": 400}),
    "knorm": KVCacheConfig(evict="knorm", decode={"interval": 48, "target_tokens": 300}),
    "snapkv": KVCacheConfig(evict="snapkv", decode={"interval": 96, "target_tokens": 350, "buffer": 128}),
    "knorm_ratio": KVCacheConfig(evict="knorm", decode={"interval": 40, "ratio": 0.4}),
    "prefill_and_decode": KVCacheConfig(evict="streaming_llm", ratio=0.5,
                                        decode={"interval": 32, "target_tokens": 200}),
}


@pytest.fixture(scope="module")
def kvlab_results(parity_engine, recall_item) -> dict:
    """kvlab's result of every config on the recall item, the configs decoded together."""
    results = dict(zip(CONFIGS, parity_engine.evaluate(recall_item, list(CONFIGS.values())), strict=True))
    assert all(result.config_name == CONFIGS[name].label for name, result in results.items())
    return results


@pytest.mark.parametrize("name", CONFIGS)
def test_generated_text_matches_kvpress_decoding_press(engine, kvpress_pipeline, recall_item, kvlab_results, name):
    config = CONFIGS[name]
    ours = kvlab_results[name]
    theirs = kvpress_answer(kvpress_pipeline, engine.tokenizer, recall_item, _kvpress_press(config),
                            ours.output_tokens)
    assert ours.output_tokens > config.decode.interval  # the cache was cut during the answer
    assert ours.generated == theirs, name


def test_bytes_over_generation_are_measured_and_fall_at_each_compression(engine, recall_item):
    config = CONFIGS["streaming_llm"]
    baseline, ours = engine.evaluate(recall_item, [KVCacheConfig(), config])
    trace = ours.extra["generation_kv"]
    tokens, sizes = trace["tokens"], trace["bytes"]
    assert tokens == sorted(tokens) and tokens[-1] == trace["final_tokens"]
    assert any(later < earlier for earlier, later in zip(sizes, sizes[1:], strict=False))  # cut while generating
    assert trace["final_baseline_bytes"] == engine.geometry.baseline_bytes(trace["final_tokens"])
    assert trace["final_ratio"] == pytest.approx(trace["final_baseline_bytes"] / trace["final_bytes"])
    # after the first cut the cache holds 400 tokens of 16-bit keys and values, then grows by at most
    # one interval before the next cut
    first_cut = next(i for i in range(1, len(sizes)) if sizes[i] < sizes[i - 1])
    per_token = engine.geometry.baseline_bytes(1)
    assert sizes[first_cut] >= 400 * per_token
    assert max(sizes[first_cut:]) <= (400 + config.decode.interval) * per_token
    assert ours.peak_kv_bytes >= max(sizes)
    # the baseline only grows: its final cache is its uncompressed tokens
    grown = baseline.extra["generation_kv"]
    assert grown["final_bytes"] == grown["final_baseline_bytes"]
    assert grown["bytes"] == sorted(grown["bytes"])


def test_a_batch_of_policies_decodes_as_each_alone(smollm, engine, recall_item):
    configs = [KVCacheConfig(), CONFIGS["knorm"], CONFIGS["snapkv"],
               KVCacheConfig(quant="int4", evict="streaming_llm", ratio=0.3, decode={"interval": 40, "ratio": 0.3})]
    together = {r.config_name: r for r in engine.evaluate(recall_item, configs)}  # with fidelity, as experiments
    alone = EmbeddedEngine(smollm, seed=0, max_batch=1, fidelity=False)  # the reference: no member beside it
    for result in alone.evaluate(recall_item, configs):
        batched = together[result.config_name]
        assert batched.generated == result.generated, result.config_name
        assert batched.extra["generation_kv"]["bytes"] == result.extra["generation_kv"]["bytes"]


def test_every_method_that_decodes_cuts_the_cache_during_generation(engine):
    """Each method the registry lets score during generation does, on a 256-token prompt cut back to 100
    tokens after 65 passes (kvpress refuses the others' scores in a decoding step: leverage, ...)."""
    from dataclasses import replace

    from kvlab.core.methods import methods_that_decode

    item = generate_items(TaskSpec(name="recall", context_lengths=[256], num_items=1), engine.tokenizer, seed=3)[0]
    item = replace(item, max_new_tokens=80, stop=())
    configs = [KVCacheConfig(evict=m, decode={"interval": 65, "target_tokens": 100}) for m in methods_that_decode()]
    per_token = engine.geometry.baseline_bytes(1)
    for result in engine.evaluate(item, configs):
        trace = result.extra["generation_kv"]
        assert result.output_tokens == 80
        # cut to 100 tokens at the 65th pass, then 15 more passes
        assert trace["final_bytes"] == (100 + 15) * per_token, result.config_name
