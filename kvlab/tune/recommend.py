"""The answer of a tune, ready to deploy: the config, what it measured, and how to run it.

For every backend it says how to deploy the choice: the exact ``kvlab serve`` command (kvlab's
own server runs every config), and for vLLM / SGLang the exact ``--kv-cache-dtype`` flag when the
engine has that cache -- or a plain statement that it has no equivalent (token eviction, integer
KIVI codes).
"""

from __future__ import annotations

import shlex
from typing import Any

import tomli_w

from kvlab.analysis.summary import ConfigSummary, Decision
from kvlab.core.axes import given_leaves
from kvlab.core.formats import FORMATS
from kvlab.core.kv_config import KVCacheConfig, SkipLayers
from kvlab.core.units import MIB
from kvlab.engines.servers import SERVERS, serving_engine


def engine_title(kind: str) -> str:
    """A serving engine's name as a recommendation shows it (its kind, for one this kvlab no longer knows)."""
    return SERVERS[kind].title if kind in SERVERS else kind


def serve_command(model: str, config: KVCacheConfig) -> str:
    """``kvlab serve`` with ``config`` as every request's default KV cache: the option of each axis that
    applies and is off its default (:func:`kvlab.core.axes.given_leaves`), a format's settings also when
    the config's label shows them (``int4/g64/r64``)."""
    argv = ["kvlab", "serve", "--model", model]
    for leaf, value in given_leaves(config):
        assert leaf.flag is not None
        values = value if isinstance(value, tuple) else (value,)
        argv += [_flag(leaf.flag), *(str(v).lower() if isinstance(v, bool) else _number(v)
                                     if isinstance(v, float | int) else str(v) for v in values)]
    return shlex.join(argv)


def _number(value: float) -> str:
    """A whole number as it is (``:g`` would write 1234567 as 1.23457e+06), a fraction shortest."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def _flag(field: str) -> str:
    """The ``kvlab serve`` option of a ``KVCacheConfig`` field."""
    return f"--{field.replace('_', '-')}"


def engine_flag(kind: str, config: KVCacheConfig, num_layers: int | None = None) -> dict[str, str | None]:
    """``{"flag": "--kv-cache-dtype X" | None, "statement": ...}`` for launching engine ``kind`` (its own flags:
    llama.cpp's ``--cache-type-k X --cache-type-v Y -fa on``); ``num_layers``
    (the model's) names the last layers a config keeps 16-bit."""
    server = serving_engine(kind)
    name = server.title
    dtype = server.kv_dtypes.get(config.quant)
    value_dtype = server.kv_dtypes.get(config.value_format)
    if config.evict != "none":
        return {"flag": None, "statement": (
            f"{name} has no equivalent: it evicts no tokens from a sequence's KV cache ({config.evict} needs the "
            "embedded engine or `kvlab serve`)" + (f"; its quantization alone is {server.deploy_flag(dtype, dtype)}"
                                                    if dtype and config.quant != "none" else ""))}
    if config.value_quant is not None and not server.separate_kv:
        return {"flag": None, "statement": (
            f"{name} has no equivalent: it stores keys and values alike, in one cache dtype (keys in "
            f"{config.quant} and values in {config.value_quant} need the embedded engine or `kvlab serve`)")}
    for quant, engine_dtype in ((config.quant, dtype), (config.value_format, value_dtype)):
        if engine_dtype is None:
            return {"flag": None, "statement": f"{name} has no equivalent of {quant}: {server.format_note(quant)}"}
    assert dtype is not None and value_dtype is not None
    flag = server.deploy_flag(dtype, value_dtype)
    if config.rotation is False and server.rotation_off_env:  # its switch, in the server's environment
        flag += " with " + " ".join(f"{name}={value}" for name, value in server.rotation_off_env.items()) + \
            " in its environment"
    if config.skip_layers is not None:
        if server.skip_layers_flag is None:
            return {"flag": None, "statement": f"{name} has no equivalent: kvlab knows no {name} flag that keeps "
                                               f"some layers 16-bit ({config.skip_layers.label}); its cache of "
                                               f"every layer in {config.quant} is {flag}"}
        flag += f" {server.skip_layers_flag} {_skipped(config.skip_layers, num_layers)}"
    return {"flag": flag, "statement": f"launch {name} with {flag}"}


def _skipped(skip: SkipLayers, num_layers: int | None) -> str:
    """The skipped layers' indices as vLLM takes them; the last ones described when the model's depth is unknown."""
    if num_layers is not None:
        return " ".join(map(str, sorted(skip.indices(num_layers))))
    listed = sorted(set(range(skip.first)) | set(skip.layers))
    last = f"<the last {skip.last} layers' indices>" if skip.last else ""
    return " ".join([*map(str, listed), *([last] if last else [])])


def _kvlab_stores(config: KVCacheConfig) -> bool:
    """Whether kvlab's own cache (``kvlab serve``) stores the config's keys and values."""
    return FORMATS[config.quant].kvlab_stores and FORMATS[config.value_format].kvlab_stores


def config_toml(config: KVCacheConfig) -> str:
    """The config as a ``[[configs]]`` entry of a spec."""
    fields = config.model_dump(mode="json", exclude_defaults=True, exclude_none=True)
    return tomli_w.dumps({"configs": [{"name": config.label, **fields}]})


def recommendation(model: str, decision: Decision, summaries: list[ConfigSummary],
                   baseline: ConfigSummary | None, num_layers: int | None = None) -> dict[str, Any]:
    """The tune's answer as stored and shown (JSON-ready); ``config`` is None without a sweet spot.
    ``num_layers``: the model's, where the results say it (an engine flag names layers by index)."""
    spot = decision.sweet_spot
    answer: dict[str, Any] = {"rule": decision.rule, "note": decision.note, "items_needed": decision.items_needed,
                              "max_drop": decision.max_drop, "max_kl": decision.margins.max_kl,
                              "min_agreement": decision.margins.min_agreement, "configs_judged": len(summaries),
                              "config": None}
    if spot is None:
        return answer
    config = KVCacheConfig(**spot.config)
    answer |= {
        "label": spot.config_name, "config": config.model_dump(mode="json"),
        "kv_bytes": spot.physical_kv_bytes, "baseline_kv_bytes": spot.baseline_kv_bytes,
        "compression_ratio": spot.compression_ratio, "accuracy": spot.accuracy,
        "baseline_accuracy": baseline.accuracy if baseline else None,
        "diff": spot.diff_estimate, "diff_ci": [spot.diff_ci_low, spot.diff_ci_high],
        "p_adjusted": spot.p_adjusted, "n_items": spot.n_items,
        "mean_kl": spot.mean_kl, "kl_ci": [spot.kl_ci_low, spot.kl_ci_high], "agreement": spot.agreement,
        "decided_by": {v.task: v.criterion for v in spot.task_verdicts}, "bound_by": decision.bound,
        "verdicts": [v.reason for v in spot.task_verdicts],
        "ttft_ms": spot.ttft_s * 1000 if spot.ttft_s is not None else None,
        "tpot_ms": spot.tpot_s * 1000 if spot.tpot_s is not None else None,
        "kvlab_serve": serve_command(model, config) if _kvlab_stores(config) else None,
        "engines": {kind: engine_flag(kind, config, num_layers) for kind in SERVERS},
        "toml": config_toml(config),
    }
    return answer


def serving_lines(answer: dict[str, Any]) -> list[str]:
    """The engine's noise floor beside the answer's fidelity (a server's), what the sweet spot buys under the
    spec's ``[load]`` and the load target's verdict (none of them where the tune had none)."""
    load = answer.get("load") or {}
    return [*(answer.get("noise_floor") or {}).get("lines", []),
            *([f"under load: {load['gain']}"] if load.get("gain") else []), *load.get("target_lines", [])]


def describe(answer: dict[str, Any]) -> list[str]:
    """The recommendation as the lines ``kvlab tune`` prints."""
    serving = serving_lines(answer)
    if answer.get("config") is None:
        return [f"no config passes the rule: {answer.get('note') or 'none of the candidates passed it'}", *serving]
    low, high = answer["diff_ci"]
    lines = [
        f"recommended: {answer['label']}: {answer['kv_bytes'] / MIB:.2f} MiB KV per item measured "
        f"({answer['compression_ratio']:.1f}x smaller than the 16-bit baseline), accuracy {answer['accuracy']:.3f} "
        f"vs {answer['baseline_accuracy']:.3f}, difference {answer['diff']:+.3f} [{low:+.3f}, {high:+.3f}] "
        f"on {answer['n_items']} items",
    ]
    if answer.get("mean_kl") is not None:
        kl_low, kl_high = answer["kl_ci"]
        lines.append(f"fidelity: mean KL {answer['mean_kl']:.3g} nats per token [{kl_low:.3g}, {kl_high:.3g}], top-1 "
                     f"agreement {answer['agreement']:.1%} with the baseline")
    if answer.get("decided_by"):
        lines.append("decided by " + ", ".join(f"{task}: {how}" for task, how in answer["decided_by"].items()))
    if answer.get("bound_by"):
        lines.append(answer["bound_by"])
    latency = [f"{name} {answer[key]:.0f} ms" for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"))
               if answer.get(key) is not None]
    if latency:
        lines.append("latency (median): " + ", ".join(latency))
    lines += serving
    if answer.get("kvlab_serve"):  # None for an engine's own format, which kvlab's cache does not store
        lines.append(f"deploy: {answer['kvlab_serve']}")
    for kind, engine in answer["engines"].items():  # the engines known when the tune ended
        lines.append(f"{engine_title(kind)}: {engine['statement']}")
    lines.append("as a spec entry:\n" + answer["toml"].rstrip())
    return lines
