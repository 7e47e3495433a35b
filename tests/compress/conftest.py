"""kvpress's own pipeline on its own copy of the default model: the outside reference of the parity tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def kvpress_pipeline():
    """kvpress's pipeline on a second SmolLM2, loaded here and never touched by kvlab (no kvlab attention
    installed, no hooks): its press hooks, its DynamicCache, its greedy decoding."""
    from kvpress import KVPressTextGenerationPipeline

    from kvlab.models import DEFAULT_MODEL, load_model

    fresh = load_model(DEFAULT_MODEL)  # a second instance: kvlab's engine never sees it
    assert fresh.model.config._attn_implementation == "sdpa"
    return KVPressTextGenerationPipeline(model=fresh.model, tokenizer=fresh.tokenizer)



@pytest.fixture(scope="session")
def parity_engine(smollm):
    """kvlab's engine for the parity tests: each item's configs decode in one batch (the product's own path),
    and no fidelity baseline is added (these tests compare the text and the bytes, not the drift)."""
    from kvlab.engines.embedded import EmbeddedEngine

    return EmbeddedEngine(smollm, seed=0, fidelity=False)
