"""kvlab's eviction against NVIDIA kvpress's own pipeline, on a freshly loaded model.

kvpress runs on its own copy of SmolLM2, loaded here and never touched by kvlab (no kvlab attention
installed, no hooks): its press hooks, its DynamicCache, its greedy decoding.  kvlab's engine runs
the same token ids (context compressed before the question, as kvpress does).  The generated text
must be identical, item for item: an outside reference that fails when kvlab's attention, scoring
or token selection drifts.
"""

from __future__ import annotations

import pytest

from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tasks import TaskSpec
from kvlab.tasks import generate_items
from tests.compress.reference import kvpress_answer

pytestmark = pytest.mark.model

PRESSES = ["snapkv", "streaming_llm", "knorm"]


def _press(method: str, ratio: float):
    from kvpress import KnormPress, SnapKVPress, StreamingLLMPress

    return {"snapkv": SnapKVPress, "streaming_llm": StreamingLLMPress, "knorm": KnormPress}[method](
        compression_ratio=ratio)


@pytest.mark.parametrize("method", PRESSES)
def test_generated_text_matches_kvpress(engine, kvpress_pipeline, method):
    items = generate_items(TaskSpec(name="passkey", context_lengths=[512], depths=[0.3, 0.7], num_items=2),
                           engine.tokenizer, seed=11)
    config = KVCacheConfig(evict=method, ratio=0.5)
    for item in items:
        ours = next(iter(engine.evaluate(item, [config])))
        theirs = kvpress_answer(kvpress_pipeline, engine.tokenizer, item, _press(method, 0.5), ours.output_tokens)
        assert ours.generated == theirs, (item.item_id, method)
        assert ours.kept_fraction == pytest.approx(0.5, abs=0.01)
