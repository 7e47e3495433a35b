"""The registries as Markdown tables: formats, budgets, eviction methods, head budgets, tasks, answer scorers,
backends and models, each read from its one registry in :mod:`kvlab.core`."""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.core.backends import BACKENDS
from kvlab.core.formats import FORMATS
from kvlab.core.methods import BUDGETS, HEAD_BUDGETS, METHODS, PARAMS, REFUSED
from kvlab.core.model_registry import KNOWN_MODELS
from kvlab.core.tasks import ANSWER_SCORERS, TASKS
from kvlab.reference import cell
from kvlab.reference.schema import anchor


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(cell(value) for value in row) + " |" for row in rows), ""]


def _codes(names: object) -> str:
    return ", ".join(f"`{name}`" for name in names) if names else "-"  # type: ignore[attr-defined]


def formats() -> list[str]:
    return ["## Quantization formats", "", "`quant` and `value_quant` of a config (`kvlab methods` prints them too).",
            "", *_table(("name", "bits", "stored as", "what", "scales", "settings it reads"), [
                (f"`{f.name}`", str(f.bits), f.storage_dtype, f.description + (
                    f" (also: {', '.join(f.aliases)})" if f.aliases else ""), f.group_rule,
                 _codes(s.field for s in f.settings)) for f in FORMATS.values()])]


def budgets() -> list[str]:
    return ["## Budget kinds", "", "An eviction config gives exactly one (or none, with a decode policy).", "",
            *_table(("field", "label", "range", "what"), [
                (f"`{b.name}`", f"`{b.label}`", f"{b.low:g} < x < {b.high:g}" + (" (tokens)" if b.integer else ""),
                 b.help) for b in BUDGETS.values()])]


def methods() -> list[str]:
    rows = [(f"`{m.name}`" + (f" ({', '.join(m.aliases)})" if m.aliases else ""), f"`{m.press}`", m.description,
             m.paper, _codes(m.budgets), _codes(m.params), "yes" if m.decodes else f"no: {m.decode_refusal}",
             "yes" if m.headwise else f"no: {m.heads_refusal}") for m in METHODS.values()]
    params = [(f"`{name}`", str(p.default), f"{p.low}..{p.high}", p.help) for name, p in PARAMS.items()]
    return ["## Eviction methods", "", "`evict` of a config: each a kvpress press that scores the context's tokens.",
            "", *_table(("name", "kvpress press", "scores", "paper", "budgets", "parameters", "decode policy",
                         "head-wise budget"), rows),
            "### Method parameters", "", *_table(("field", "default", "range", "what"), params),
            "### kvpress presses not offered", "", *_table(("press", "why"), list(REFUSED.items()))]


def head_budgets() -> list[str]:
    return ["## Head budgets", "", "`heads` of a config: how a layer's budget is shared out across its KV heads.", "",
            *_table(("name", "kvpress press", "what", "paper"), [
                (f"`{h.name}`", f"`{h.press}`" if h.press else "-", h.description, h.paper)
                for h in HEAD_BUDGETS.values()])]


def tasks() -> list[str]:
    rows = [(f"`{t.name}`", (t.params.__doc__ or "").split(":", 1)[-1].strip() if t.params.model_fields else "-",
             t.kind, "fidelity only" if t.fidelity_only else (f"`{t.scorer}`" if t.scorer else "its NLL"),
             t.chance_floor, f"[{', '.join(t.params.model_fields)}](spec.md#{anchor(t.params)})"
             if t.params.model_fields else "none") for t in TASKS.values()]
    return ["## Tasks", "", "`name` of a `[[tasks]]` table; its parameters are in the "
            "[spec reference](spec.md#taskspec).", "",
            *_table(("name", "items", "kind", "scored by", "chance floor", "parameters"), rows)]


def scorers() -> list[str]:
    return ["## Answer scorers", "", "How a JSONL row's answer is scored (the task's `scorer`, or a row's own). "
            "Normalised: lowercased, punctuation to spaces, whitespace collapsed.", "",
            *_table(("name", "rule"), [(f"`{s.name}`", s.help) for s in ANSWER_SCORERS.values()])]


def backends() -> list[str]:
    rows = [(f"`{b.name}`", b.title, b.description, {"all": "every config", "server_dtypes": "the server's KV dtypes",
                                                     "none": "the baseline only"}[b.kv_choice],
             ", ".join(f"`{k}` → `{v}`" for k, v in b.kv_dtypes.items()) or "-", _codes(b.fields))
            for b in BACKENDS.values()]
    return ["## Backends", "", "`kind` of `[backend]`.", "",
            *_table(("kind", "name", "what", "configs it runs", "`--kv-cache-dtype` per format", "fields it reads"),
                    rows)]


def server_settings() -> list[str]:
    """Each engine setting of ``[backend.server]`` as each engine kvlab launches takes it: its own flag, or why not
    (what a spec that sets it is told), from the engines' own declarations."""
    from kvlab.core.experiment_spec import ServerOptions
    from kvlab.engines.servers import SERVERS

    engines = list(SERVERS.values())
    rows = [(f"`{name}`", *(f"`{engine.setting_flags[name]}`" if name in engine.setting_flags
                            else f"refused: {engine.why_lacks(name)}" for engine in engines))
            for name in ServerOptions.ENGINE_SETTINGS]
    return ["## Server settings by engine", "", "The engine settings of `[backend.server]` ([spec reference]"
            "(spec.md#serveroptions)) and each launched engine's own flag for them; a setting an engine does not "
            "take is refused when set, with the reason shown.", "",
            *_table(("setting", *(engine.title for engine in engines)), rows)]


def models() -> list[str]:
    rows = [(f"`{m.name}`", m.display_name, m.params, str(m.num_layers), str(m.num_kv_heads), str(m.head_dim),
             f"{m.max_context:,}", f"{m.sliding_window:,}" if m.sliding_window else "-", f"{m.download_mb} MB",
             m.source) for m in KNOWN_MODELS.values()]
    return ["## Models", "", "`model` of a spec (`kvlab models list`, `kvlab models pull NAME`).", "",
            *_table(("name", "model", "parameters", "layers", "KV heads", "head dim", "max context",
                     "sliding window", "download", "source"), rows)]


def registries_page() -> str:
    """The registries page."""
    lines = ["# Registries", "", "Generated from kvlab's registries (`python -m kvlab.reference`): each vocabulary "
             "below is one table in `kvlab/core/` that validation, the CLI, the dashboard and the engines read.", ""]
    for section in (formats, budgets, methods, head_budgets, tasks, scorers, backends, server_settings, models):
        lines += section()
    return "\n".join(lines).rstrip() + "\n"
