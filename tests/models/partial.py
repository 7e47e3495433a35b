"""A copy of the default model's checkpoint that holds only some of its weight tensors (issue 47, row 14):
its config and tokenizer files, and the first ``keep`` tensors of its safetensors file."""

from __future__ import annotations

import shutil
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file


def partial_checkpoint(folder: Path, keep: int | None = 1) -> Path:
    """``folder/partial``: SmolLM2's config.json, tokenizer and chat-template files, and a model.safetensors
    with its first ``keep`` tensors (``None``: all of them)."""
    from kvlab.models import DEFAULT_MODEL, pull_model

    source = pull_model(DEFAULT_MODEL)
    path = folder / "partial"
    path.mkdir()
    for file in source.iterdir():
        if file.suffix in (".json", ".jinja") and file.name != "kvlab-model.json":
            shutil.copy(file, path / file.name)
    with safe_open(source / "model.safetensors", "pt") as weights:
        names = list(weights.keys())[:keep]
        save_file({name: weights.get_tensor(name) for name in names}, path / "model.safetensors",
                  metadata={"format": "pt"})
    return path
