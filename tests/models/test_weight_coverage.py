"""A checkpoint whose weights do not cover its model is refused (issue 47, row 14): transformers would start the
missing tensors from random values and only log it; the run reached "sweet spot: int4 ... decided by fidelity"
on a directory with one tensor of 272.  A weight tied to another (SmolLM2's ``lm_head`` shares the embeddings,
and its checkpoint holds no ``lm_head.weight``) is not missing."""

from __future__ import annotations

import pytest
from safetensors import safe_open

from kvlab.models import load_model
from kvlab.models.errors import ModelFileError
from tests.models.partial import partial_checkpoint

pytestmark = pytest.mark.model


def test_a_checkpoint_with_one_tensor_of_its_model_is_refused_naming_what_is_missing(tmp_path):
    path = partial_checkpoint(tmp_path, keep=1)
    with pytest.raises(ModelFileError) as refused:
        load_model(path)
    message = str(refused.value)
    assert message.startswith(f"{path.resolve()}: its weights do not cover the model: 271 of its 273 weight tensors "
                              "are not in the checkpoint (model.layers.0."), message
    assert "would start from random values" in message and "\n" not in message


def test_a_checkpoint_whose_only_absent_weight_is_tied_loads(tmp_path):
    """All 272 tensors of SmolLM2's file, no ``lm_head.weight``: tied to ``model.embed_tokens.weight``."""
    path = partial_checkpoint(tmp_path, keep=None)
    with safe_open(path / "model.safetensors", "pt") as weights:
        assert "lm_head.weight" not in weights.keys() and len(weights.keys()) == 272
    loaded = load_model(path)
    assert loaded.model.get_output_embeddings().weight is loaded.model.get_input_embeddings().weight
