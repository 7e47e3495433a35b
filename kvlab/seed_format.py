"""Specs shaped like the blog post kvlab was seeded from, mapped onto kvlab's real options.

The blog's file has ``[server] base_url/api_key/model_id`` and ``[kv_cache] dtype, bits,
compression_ratio, eviction_threshold, sparse_top_k, max_context_length``.  Several of those
knobs exist in no serving engine; this module maps what has a real counterpart and says
plainly what does not.
"""

from __future__ import annotations

import math
from typing import Any

from kvlab.compress.accounting import STORAGE_BYTES_PER_ELEMENT, bytes_per_element
from kvlab.core.errors import ConfigError
from kvlab.core.formats import BLOG_BITS, BLOG_DTYPES
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.methods import BUDGETS, METHODS
from kvlab.core.space import canonical_name

SEED_SECTIONS = {"server", "kv_cache"}
SEED_SERVER_KEYS = {"base_url", "api_key", "model_id"}
SEED_KV_KEYS = {"dtype", "bits", "compression_ratio", "eviction_threshold", "sparse_top_k", "max_context_length",
                "eviction_method"}
DTYPE_MAP = BLOG_DTYPES  # the format registry's blog_names
BITS = dict(sorted(BLOG_BITS.items(), reverse=True))
DEFAULT_SCORER = "snapkv"
#: The blog's budgets each need a budget kind of kvlab's (the budget registry's ``blog_keys``):
#: eviction_threshold -> threshold, sparse_top_k and compression_ratio -> keep_fraction; an
#: eviction_method is offered only the budgets it accepts.
SEED_BUDGETS = {key: kind.name for kind in BUDGETS.values() for key in kind.blog_keys}
#: compression_ratio targets that would keep fewer tokens than this are refused.
MIN_KEEP_FRACTION = 0.001
MIN_CONTEXT = 128


def is_seed_style(data: dict[str, Any]) -> bool:
    return bool(SEED_SECTIONS & data.keys()) and "configs" not in data and "sweep" not in data


def _shown(value: Any) -> str:
    """A value as the message quotes it (cut: a spec may hold a megabyte-long string)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _table(data: dict[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{name} = {_shown(value)}: must be a [{name}] table")
    return value


def _text(section: dict[str, Any], where: str, key: str) -> str | None:
    value = section.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"[{where}] {key} = {_shown(value)}: must be a string")
    return value


def _fraction(kv: dict[str, Any], key: str, meaning: str) -> float:
    """``kv[key]``, a number strictly between 0 and 1."""
    value = kv[key]
    if not _is_number(value) or not 0 < value < 1:
        raise ConfigError(f"[kv_cache] {key} = {_shown(value)}: must be a number between 0 and 1 (exclusive), "
                          f"{meaning}")
    return float(value)


def _is_number(value: Any) -> bool:
    """An int or a finite float (TOML's nan and inf, and booleans, are not numbers here)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _quant_from(kv: dict[str, Any]) -> str:
    if "bits" in kv and "dtype" in kv:
        raise ConfigError("[kv_cache]: give dtype or bits, not both")
    if "bits" in kv:
        bits = kv["bits"]
        if not isinstance(bits, int) or isinstance(bits, bool) or bits not in BITS:
            raise ConfigError(f"[kv_cache] bits = {_shown(bits)}: allowed values are {', '.join(map(str, BITS))}")
        return BITS[bits]
    dtype = _text(kv, "kv_cache", "dtype") or "auto"
    if dtype.lower() not in DTYPE_MAP:
        raise ConfigError(f"[kv_cache] dtype = {_shown(dtype)}: allowed values are {', '.join(DTYPE_MAP)}")
    return DTYPE_MAP[dtype.lower()]


def _eviction_method(kv: dict[str, Any]) -> str:
    method = _text(kv, "kv_cache", "eviction_method") or DEFAULT_SCORER
    canonical = canonical_name(method)
    if canonical not in METHODS:
        raise ConfigError(f"[kv_cache] eviction_method = {_shown(method)}: allowed values are "
                          f"{', '.join(METHODS)}")
    for key, budget in SEED_BUDGETS.items():
        if key in kv and budget not in METHODS[canonical].budgets:
            raise ConfigError(f"[kv_cache] eviction_method = {_shown(method)} cannot take {key} (kvlab {budget}); "
                              f"its budgets: {', '.join(METHODS[canonical].budgets)}")
    return canonical


def _keep_for_ratio(target: Any, quant: str) -> float:
    """The fraction of tokens to keep so that ``quant`` plus eviction reaches ``target`` x."""
    if not _is_number(target) or target <= 1:
        raise ConfigError(
            f"[kv_cache] compression_ratio = {_shown(target)}: kvlab reads it as a target ratio, a number > 1 "
            "(baseline bytes / physical bytes, e.g. 4.0 for 4x). For the fraction of tokens removed (kvpress's "
            "compression_ratio) use a native spec with evict and ratio")
    per_element = bytes_per_element(KVCacheConfig(quant=quant))
    keep = STORAGE_BYTES_PER_ELEMENT / (per_element * target)
    if keep < MIN_KEEP_FRACTION:
        highest = STORAGE_BYTES_PER_ELEMENT / (per_element * MIN_KEEP_FRACTION)
        raise ConfigError(f"[kv_cache] compression_ratio = {target:g}: at most {highest:,.0f} with "
                          f"{quant if quant != 'none' else 'no quantization'} "
                          f"(eviction keeps at least {MIN_KEEP_FRACTION:.1%} of the tokens)")
    return keep


def translate_seed_spec(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A native spec dict and warnings for a seed-style spec.  Every value of [server] and
    [kv_cache] is checked here, so that errors name the seed-style key, not the native field it
    maps to."""
    warnings: list[str] = []
    unknown_sections = set(data) - SEED_SECTIONS - {"name", "model", "seed", "tasks", "backend", "tags", "notes"}
    if unknown_sections:
        raise ConfigError(f"unknown sections {sorted(unknown_sections)} in a seed-style spec; "
                          f"allowed: [server], [kv_cache], [[tasks]], name, model, seed")
    kv = dict(_table(data, "kv_cache"))
    unknown = set(kv) - SEED_KV_KEYS
    if unknown:
        raise ConfigError(f"[kv_cache]: unknown keys {sorted(unknown)}; allowed: {', '.join(sorted(SEED_KV_KEYS))}")
    server = dict(_table(data, "server"))
    unknown = set(server) - SEED_SERVER_KEYS
    if unknown:
        raise ConfigError(f"[server]: unknown keys {sorted(unknown)}; allowed: {', '.join(sorted(SEED_SERVER_KEYS))}")
    native: dict[str, Any] = {k: data[k] for k in ("name", "model", "seed", "tags", "notes") if k in data}
    native.setdefault("name", "seed-style")

    if "api_key" in server:
        warnings.append("[server] api_key is ignored: kvlab never reads keys from spec files or stores them; "
                        "set the KVLAB_API_KEY environment variable or .streamlit/secrets.toml instead")
    base_url, model_id = _text(server, "server", "base_url"), _text(server, "server", "model_id")
    if base_url:
        native["backend"] = {"kind": "openai_compat", "base_url": base_url}
        if model_id:
            native["backend"]["model_id"] = model_id
            native.setdefault("model", model_id)
    elif "backend" in data:
        native["backend"] = data["backend"]

    quant = _quant_from(kv)
    budgets = {k: kv[k] for k in ("eviction_threshold", "sparse_top_k", "compression_ratio") if k in kv}
    config: dict[str, Any] = {"name": "seed-config", "quant": quant}
    method = _eviction_method(kv)
    if len(budgets) > 1:
        raise ConfigError(f"[kv_cache]: {', '.join(budgets)} are competing budgets; keep one "
                          "(eviction_threshold: evict tokens below this score quantile; sparse_top_k: fraction "
                          "of tokens kept; compression_ratio: target baseline/physical bytes, e.g. 4.0)")
    if "eviction_threshold" in budgets:
        config.update(evict=method, threshold=_fraction(kv, "eviction_threshold",
                                                        "the score quantile below which tokens are evicted"))
    elif "sparse_top_k" in budgets:
        config.update(evict=method, keep_fraction=_fraction(kv, "sparse_top_k", "the fraction of tokens kept"))
    elif "compression_ratio" in budgets:
        target = kv["compression_ratio"]
        keep = _keep_for_ratio(target, quant)
        if keep < 1:
            config.update(evict=method, keep_fraction=round(keep, 4))
            warnings.append(f"compression_ratio = {target:g}: {quant} alone gives about "
                            f"{STORAGE_BYTES_PER_ELEMENT / bytes_per_element(KVCacheConfig(quant=quant)):.2f}x, "
                            f"so {method} keeps {keep:.1%} of the tokens; the measured ratio is in the results")
    if "eviction_method" in kv and "evict" not in config:
        warnings.append("[kv_cache] eviction_method is ignored: no eviction budget was given")
    max_context = kv.get("max_context_length")
    if max_context is not None:
        if not isinstance(max_context, int) or isinstance(max_context, bool) or max_context < MIN_CONTEXT:
            raise ConfigError(f"[kv_cache] max_context_length = {_shown(max_context)}: must be a whole number "
                              f">= {MIN_CONTEXT} (tokens)")
        native["max_context_length"] = max_context
    native["tasks"] = data.get("tasks", [{"name": "passkey", "context_lengths": [min(1024, max_context or 1024)]}])
    native["configs"] = [config] if (config["quant"] != "none" or "evict" in config) else []
    if not native["configs"]:
        native["configs"] = [{"name": "baseline"}]

    backend = native.get("backend", {}).get("kind", "embedded") if isinstance(native.get("backend"), dict) \
        else "embedded"
    if backend != "embedded":
        if quant != "none" or "evict" in config:
            warnings.append(
                f"backend {backend}: an OpenAI-compatible endpoint decides its own KV cache; [kv_cache] "
                f"{', '.join(k for k in kv if k != 'max_context_length')} cannot be applied through the API "
                "unless the endpoint is `kvlab serve` (which applies a config per request). Run with --backend "
                "embedded to measure these settings, or --backend vllm / sglang to launch a server with "
                "--kv-cache-dtype fp8_e4m3 (no engine has token eviction)")
    if kv.get("bits") == 2:
        warnings.append("2-bit KV exists only in kvlab's embedded engine: vLLM and SGLang have no 2-bit KV cache")
    return native, warnings
