"""Specs shaped like the blog post kvlab was seeded from, mapped onto kvlab's real options.

The blog's file has ``[server] base_url/api_key/model_id`` and ``[kv_cache] dtype, bits,
compression_ratio, eviction_threshold, sparse_top_k, max_context_length``.  Several of those
knobs exist in no serving engine; this module maps what has a real counterpart and says
plainly what does not.
"""

from __future__ import annotations

from typing import Any

from kvlab.compress.accounting import STORAGE_BYTES_PER_ELEMENT, bytes_per_element
from kvlab.config import ConfigError, KVCacheConfig

SEED_SECTIONS = {"server", "kv_cache"}
SEED_KV_KEYS = {"dtype", "bits", "compression_ratio", "eviction_threshold", "sparse_top_k", "max_context_length",
                "eviction_method"}
DTYPE_MAP = {"fp16": "none", "bf16": "none", "float16": "none", "bfloat16": "none", "auto": "none",
             "int8": "int8", "int4": "int4", "int2": "int2", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3",
             "fp8_e5m2": "fp8_e5m2"}
DEFAULT_SCORER = "snapkv"


def is_seed_style(data: dict[str, Any]) -> bool:
    return bool(SEED_SECTIONS & data.keys()) and "configs" not in data and "sweep" not in data


def _quant_from(kv: dict[str, Any]) -> str:
    if "bits" in kv and "dtype" in kv:
        raise ConfigError("[kv_cache]: give dtype or bits, not both")
    if "bits" in kv:
        bits = kv["bits"]
        allowed = {16: "none", 8: "int8", 4: "int4", 2: "int2"}
        if bits not in allowed:
            raise ConfigError(f"[kv_cache] bits = {bits!r}: allowed values are 16, 8, 4, 2")
        return allowed[bits]
    dtype = str(kv.get("dtype", "auto")).lower()
    if dtype not in DTYPE_MAP:
        raise ConfigError(f"[kv_cache] dtype = {dtype!r}: allowed values are {', '.join(DTYPE_MAP)}")
    return DTYPE_MAP[dtype]


def translate_seed_spec(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A native spec dict and warnings for a seed-style spec."""
    warnings: list[str] = []
    unknown_sections = set(data) - SEED_SECTIONS - {"name", "model", "seed", "tasks", "backend", "tags", "notes"}
    if unknown_sections:
        raise ConfigError(f"unknown sections {sorted(unknown_sections)} in a seed-style spec; "
                          f"allowed: [server], [kv_cache], [[tasks]], name, model, seed")
    kv = dict(data.get("kv_cache", {}))
    unknown = set(kv) - SEED_KV_KEYS
    if unknown:
        raise ConfigError(f"[kv_cache]: unknown keys {sorted(unknown)}; allowed: {', '.join(sorted(SEED_KV_KEYS))}")
    server = dict(data.get("server", {}))
    native: dict[str, Any] = {k: data[k] for k in ("name", "model", "seed", "tags", "notes") if k in data}
    native.setdefault("name", "seed-style")

    if "api_key" in server:
        warnings.append("[server] api_key is ignored: kvlab never reads keys from spec files or stores them; "
                        "set the KVLAB_API_KEY environment variable or .streamlit/secrets.toml instead")
    if server.get("base_url"):
        native["backend"] = {"kind": "openai_compat", "base_url": server["base_url"]}
        if server.get("model_id"):
            native["backend"]["model_id"] = server["model_id"]
            native.setdefault("model", server["model_id"])
    elif "backend" in data:
        native["backend"] = data["backend"]

    quant = _quant_from(kv)
    budgets = {k: kv[k] for k in ("eviction_threshold", "sparse_top_k", "compression_ratio") if k in kv}
    config: dict[str, Any] = {"name": "seed-config", "quant": quant}
    method = kv.get("eviction_method", DEFAULT_SCORER)
    if len(budgets) > 1:
        raise ConfigError(f"[kv_cache]: {', '.join(budgets)} are competing budgets; keep one "
                          "(eviction_threshold: evict tokens below this score quantile; sparse_top_k: fraction "
                          "of tokens kept; compression_ratio: target baseline/physical bytes, e.g. 4.0)")
    if "eviction_threshold" in budgets:
        config.update(evict=method, threshold=budgets["eviction_threshold"])
    elif "sparse_top_k" in budgets:
        config.update(evict=method, keep_fraction=budgets["sparse_top_k"])
    elif "compression_ratio" in budgets:
        target = float(budgets["compression_ratio"])
        if target <= 1:
            raise ConfigError(
                f"[kv_cache] compression_ratio = {target}: kvlab reads it as a target ratio (baseline bytes / "
                "physical bytes, e.g. 4.0 for 4x). For the fraction of tokens removed (kvpress's "
                "compression_ratio) use a native spec with evict and ratio")
        per_element = bytes_per_element(KVCacheConfig(quant=quant))
        keep = STORAGE_BYTES_PER_ELEMENT / (per_element * target)
        if keep < 1:
            config.update(evict=method, keep_fraction=round(keep, 4))
            warnings.append(f"compression_ratio = {target:g}: {quant} alone gives about "
                            f"{STORAGE_BYTES_PER_ELEMENT / per_element:.2f}x, so {method} keeps {keep:.1%} of the "
                            "tokens; the measured ratio is in the results")
    if "eviction_method" in kv and "evict" not in config:
        warnings.append("[kv_cache] eviction_method is ignored: no eviction budget was given")
    if "max_context_length" in kv:
        native["max_context_length"] = kv["max_context_length"]
    native["tasks"] = data.get("tasks", [{"name": "passkey",
                                          "context_lengths": [min(1024, kv.get("max_context_length", 1024))]}])
    native["configs"] = [config] if (config["quant"] != "none" or "evict" in config) else []
    if not native["configs"]:
        native["configs"] = [{"name": "baseline"}]

    backend = native.get("backend", {}).get("kind", "embedded")
    if backend != "embedded":
        if quant != "none" or "evict" in config:
            warnings.append(
                f"backend {backend}: an OpenAI-compatible endpoint decides its own KV cache; [kv_cache] "
                f"{', '.join(k for k in kv if k != 'max_context_length')} cannot be applied through the API "
                "unless the endpoint is `kvlab serve` (which applies a config per request). Run with --backend "
                "embedded to measure these settings, or --backend vllm / sglang to launch a server with "
                "--kv-cache-dtype fp8_e4m3 (no engine has token eviction)")
    if "bits" in kv and kv["bits"] == 2:
        warnings.append("2-bit KV exists only in kvlab's embedded engine: vLLM and SGLang have no 2-bit KV cache")
    return native, warnings
