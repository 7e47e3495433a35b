"""Well-known model architectures, with the geometry their KV caches really have, for projections to models that
are not on this host.  Each entry cites the ``config.json`` fields it copies; a layer's window comes from
``layer_types`` / ``sliding_window_pattern`` exactly as transformers reads them (:func:`kvlab.models.model_arch`).

Capacity calculators that count every layer at the full context overstate a sliding-window model's cache (Gemma 3:
five of every six layers hold 1,024 tokens at most), which is why the windows are part of every entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvlab.core.errors import ConfigError
from kvlab.core.geometry import CacheGeometry


@dataclass(frozen=True)
class Architecture:
    """A model's KV geometry and weight count, as a projection reads them."""

    name: str
    title: str
    params: float  # parameters (the weights' bytes are params x the dtype's bytes)
    geometry: CacheGeometry
    max_context: int
    source: str  # where the figures come from


def _every(n: int, period: int, window: int) -> tuple[int | None, ...]:
    """Gemma 3's pattern: layer ``i`` is global when ``(i + 1) % period == 0``, else it slides over ``window``."""
    return tuple(None if (i + 1) % period == 0 else window for i in range(n))


def _alternating(n: int, window: int) -> tuple[int | None, ...]:
    """Gemma 2's and gpt-oss's pattern: even layers slide over ``window``, odd layers are global."""
    return tuple(window if i % 2 == 0 else None for i in range(n))


def _full(name: str, title: str, params: float, layers: int, kv_heads: int, head_dim: int, context: int,
          source: str) -> Architecture:
    return Architecture(name, title, params, CacheGeometry(layers, kv_heads, head_dim), context, source)


#: The built-in table: name -> architecture (``kvlab capacity --model NAME``).
ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    _full("llama-3.1-8b", "Llama 3.1 8B", 8.03e9, 32, 8, 128, 131_072,
          "meta-llama/Llama-3.1-8B config.json: num_hidden_layers 32, num_key_value_heads 8, hidden_size 4096 / "
          "num_attention_heads 32"),
    _full("llama-3.1-70b", "Llama 3.1 70B", 70.55e9, 80, 8, 128, 131_072,
          "meta-llama/Llama-3.1-70B config.json: num_hidden_layers 80, num_key_value_heads 8, hidden_size 8192 / "
          "num_attention_heads 64"),
    _full("mistral-7b-v0.3", "Mistral 7B v0.3", 7.25e9, 32, 8, 128, 32_768,
          "mistralai/Mistral-7B-v0.3 config.json: num_hidden_layers 32, num_key_value_heads 8, head_dim 128, "
          "sliding_window null"),
    _full("qwen2.5-7b", "Qwen2.5 7B", 7.62e9, 28, 4, 128, 131_072,
          "Qwen/Qwen2.5-7B config.json: num_hidden_layers 28, num_key_value_heads 4, hidden_size 3584 / "
          "num_attention_heads 28 (use_sliding_window false)"),
    _full("qwen2.5-72b", "Qwen2.5 72B", 72.71e9, 80, 8, 128, 131_072,
          "Qwen/Qwen2.5-72B config.json: num_hidden_layers 80, num_key_value_heads 8, hidden_size 8192 / "
          "num_attention_heads 64 (use_sliding_window false)"),
    Architecture("gemma-2-9b", "Gemma 2 9B", 9.24e9, CacheGeometry(42, 8, 256, _alternating(42, 4096)), 8192,
                 "google/gemma-2-9b config.json: num_hidden_layers 42, num_key_value_heads 8, head_dim 256, "
                 "sliding_window 4096 on every other layer (transformers' Gemma2: layer_idx % 2 == 0 slides)"),
    Architecture("gemma-3-12b", "Gemma 3 12B", 12.19e9, CacheGeometry(48, 8, 256, _every(48, 6, 1024)), 131_072,
                 "google/gemma-3-12b-it text_config: num_hidden_layers 48, num_key_value_heads 8, head_dim 256, "
                 "sliding_window 1024, sliding_window_pattern 6 (five local layers to one global)"),
    Architecture("gemma-3-27b", "Gemma 3 27B", 27.43e9, CacheGeometry(62, 16, 128, _every(62, 6, 1024)), 131_072,
                 "google/gemma-3-27b-it text_config: num_hidden_layers 62, num_key_value_heads 16, head_dim 128, "
                 "sliding_window 1024, sliding_window_pattern 6 (five local layers to one global)"),
    Architecture("gpt-oss-20b", "gpt-oss 20B", 20.91e9, CacheGeometry(24, 8, 64, _alternating(24, 128)), 131_072,
                 "openai/gpt-oss-20b config.json: num_hidden_layers 24, num_key_value_heads 8, head_dim 64, "
                 "sliding_window 128, layer_types alternating sliding / full"),
)}


def architecture(name_or_path: str) -> Architecture:
    """A model by the built-in table's name, kvlab's registry name (pulled or not) or a local ``config.json`` (the
    file or its directory); :class:`ConfigError` naming what is accepted otherwise."""
    if name_or_path in ARCHITECTURES:
        return ARCHITECTURES[name_or_path]
    from kvlab.core.model_registry import KNOWN_MODELS

    path = Path(name_or_path).expanduser()
    if name_or_path in KNOWN_MODELS:
        from kvlab.models.checkpoints import model_dir

        return _registry_model(name_or_path, model_dir(name_or_path) / "config.json")
    if path.name == "config.json" or (path / "config.json").is_file():
        return _from_config(path if path.name == "config.json" else path / "config.json", str(path))
    known = ", ".join([*ARCHITECTURES, *KNOWN_MODELS])
    raise ConfigError(f"{name_or_path!r} is no model kvlab knows the geometry of: give one of {known}, or a local "
                      "config.json (or the directory that holds it)")


def _registry_model(name: str, config_file: Path) -> Architecture:
    """A registry model: its converted config where it is pulled (every layer's window), else its registry entry
    (full attention only: a sliding model's layer pattern is in its config)."""
    from kvlab.core.model_registry import get_spec

    spec = get_spec(name)
    if config_file.is_file():
        found = _from_config(config_file, name)
        return Architecture(name, spec.display_name, found.params, found.geometry, found.max_context,
                            f"kvlab's model registry, its converted config ({config_file})")
    if spec.sliding_window is not None:
        raise ConfigError(f"{name}'s sliding layers are read from its config: pull it first (kvlab models pull {name})")
    scale = {"M": 1e6, "B": 1e9}[spec.params[-1]]  # the registry writes "135M", "8B"
    return Architecture(name, spec.display_name, float(spec.params[:-1]) * scale,
                        CacheGeometry(spec.num_layers, spec.num_kv_heads, spec.head_dim), spec.max_context,
                        f"kvlab's model registry ({spec.source})")


def _from_config(config_file: Path, name: str) -> Architecture:
    """A transformers ``config.json``: its geometry as :func:`kvlab.models.model_arch` reads it, its parameters
    counted on the meta device (no weights are read or allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from kvlab.models import model_arch

    try:
        config = AutoConfig.from_pretrained(str(config_file.parent))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{config_file}: not a transformers config ({str(error).splitlines()[0]})") from None
    arch = model_arch(config)
    windows = tuple(arch.sliding_window if sliding else None for sliding in arch.layer_is_sliding)
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    return Architecture(name, name, float(params), CacheGeometry(arch.num_layers, arch.num_kv_heads, arch.head_dim,
                                                                  windows),
                        arch.max_context or 0, f"{config_file}")
