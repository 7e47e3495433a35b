"""Architecture facts that KV-cache byte accounting needs, read from a transformers config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass
class ModelArch:
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    max_context: int | None
    sliding_window: int | None  # tokens a sliding layer keeps; None when no layer slides
    layer_is_sliding: list[bool]


def model_arch(config: PretrainedConfig) -> ModelArch:
    """Facts from a (possibly multimodal) config.

    Sliding layers: ``config.layer_types`` when present (Gemma 2/3, Qwen2 in transformers 5), else
    every layer slides when ``sliding_window`` is set (Mistral-style), unless ``use_sliding_window``
    is false.
    """
    cfg = config.get_text_config()
    num_layers = cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types:
        sliding = [kind == "sliding_attention" for kind in layer_types]
    else:
        sliding = [bool(window) and getattr(cfg, "use_sliding_window", True)] * num_layers
    return ModelArch(
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        max_context=getattr(cfg, "max_position_embeddings", None),
        sliding_window=window if any(sliding) else None,
        layer_is_sliding=sliding,
    )
