"""The playground page's logic (no streamlit here): its state as the URL carries it, the request it sends to
the warm engine (:mod:`kvlab.dashboard.warm_engine`), the table and token maps it draws from the answer, and
the sweep spec "Save as experiment" opens in the new-experiment form."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.limits import PLAYGROUND_CONFIGS
from kvlab.core.model_registry import DEFAULT_MODEL, KNOWN_MODELS
from kvlab.core.results import KeptPositions
from kvlab.core.tasks import FILE_TASK, TASKS, generated_tasks
from kvlab.core.urls import strip_credentials
from kvlab.dashboard.views import fmt
from kvlab.tasks.data_dir import checked_data_file
from kvlab.tasks.jsonl import read_row

#: Where an input comes from: a task's generated item, a row of a JSONL file in the data directory, or the
#: user's own text.
SOURCES = ("task", "file", "text")
#: What answers a Run: a warm ``kvlab serve`` (every config, token maps), or an OpenAI-compatible endpoint (a vLLM
#: or SGLang server: its own cache, :mod:`kvlab.dashboard.endpoint_playground`).
ENGINES = ("embedded", "endpoint")
#: The configs a first visit compares: the question the playground answers ("what does SnapKV at 75% keep,
#: and what if I quantize to int4 as well?").
DEFAULT_CONFIGS = (
    {"evict": "streaming_llm", "ratio": 0.75},
    {"evict": "snapkv", "ratio": 0.75, "query_aware": True},
    {"quant": "int4"},
    {"quant": "int4", "evict": "snapkv", "ratio": 0.75, "query_aware": True},
)
#: Most configs compared at once (the baseline comes on top): the server's limit.
MAX_CONFIGS = PLAYGROUND_CONFIGS


@dataclass(frozen=True)
class PlaygroundView:
    """Everything the page draws from, each field a query parameter of its share link (``config``: one
    compact JSON object per config, repeated; ``task_params``: the task's own parameters off their defaults, one
    compact JSON object, :func:`kvlab.dashboard.task_params.params_text`)."""

    model: str = DEFAULT_MODEL
    engine: str = "embedded"
    base_url: str = ""  # never with a user:password (the page strips it): a link carries no secret
    model_id: str = ""
    source: str = "task"
    task: str = field(default_factory=lambda: generated_tasks()[0])
    task_params: str = ""
    length: int = 1024
    depth: float = 0.5
    seed: int = 0
    file: str = ""
    row: int = 1
    context: str = ""
    question: str = ""
    answer: str = ""
    config: tuple[str, ...] = field(default_factory=lambda: tuple(config_text(c) for c in DEFAULT_CONFIGS))

    def params(self) -> dict[str, str | list[str]]:
        """The query parameters that differ from a first visit's (a default stays out of the link)."""
        default = PlaygroundView()
        values: dict[str, str | list[str]] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if value != getattr(default, item.name):
                values[item.name] = list(value) if isinstance(value, tuple) else str(value)
        return values

    @classmethod
    def from_params(cls, query: Mapping[str, str | list[str]]) -> tuple[PlaygroundView, list[str]]:
        """The view of a link, and what in it was unreadable (left at its default, each said in one line)."""
        default = cls()
        values: dict[str, Any] = {}
        problems: list[str] = []
        for item in fields(cls):
            if item.name not in query:
                continue
            raw = query[item.name]
            try:
                if item.name == "config":
                    texts = [raw] if isinstance(raw, str) else list(raw)
                    if len(texts) > MAX_CONFIGS:
                        raise ValueError(f"{len(texts)} configs, at most {MAX_CONFIGS} at once")
                    values["config"] = tuple(config_text(json.loads(text)) for text in texts)
                    continue
                if item.name == "task_params":
                    values["task_params"] = _params_text(raw if isinstance(raw, str) else raw[-1])
                    continue
                text = raw if isinstance(raw, str) else raw[-1]
                kind = type(getattr(default, item.name))
                values[item.name] = kind(text)
            except (ValueError, TypeError) as error:
                problems.append(f"{item.name}: {str(error).splitlines()[0]} (left at its default)")
        for name, allowed in (("source", SOURCES), ("engine", ENGINES), ("model", tuple(KNOWN_MODELS))):
            if values.get(name, getattr(default, name)) not in allowed:
                problems.append(f"{name}: {values[name]!r} is not one of {', '.join(allowed)} (left at its default)")
                values[name] = getattr(default, name)
        values["base_url"] = strip_credentials(values.get("base_url", ""))
        return cls(**values), problems

    def configs(self) -> list[dict[str, Any]]:
        return [json.loads(text) for text in self.config]

    def task_param_values(self) -> dict[str, Any]:
        """The task's own parameters the view sets (the others at their defaults)."""
        return json.loads(self.task_params) if self.task_params else {}

    def item(self) -> dict[str, Any]:
        """The request's ``item``: a task's to generate, a file's row (read here: the server may run elsewhere)
        or the user's text.  :class:`ConfigError` for a file outside the data directory or a row it lacks."""
        if self.source == "task":
            return {"task": self.task, "context_length": self.length, "depth": self.depth, "seed": self.seed,
                    **({"params": self.task_param_values()} if self.task_params else {})}
        if self.source == "file":
            record = read_row(checked_data_file(self.file), self.row, label=self.file)
            return {key: record[key] for key in ("context", "question", "answer", "scorer", "tolerance")
                    if key in record}
        return {"context": self.context, "question": self.question, "answer": self.answer}


def _params_text(text: str) -> str:
    """A link's task parameters: a JSON object, made compact (checked against the task when the item is made)."""
    params = json.loads(text) if text else {}
    if not isinstance(params, dict):
        raise ValueError("not a JSON object of the task's parameters")
    return json.dumps(params, separators=(",", ":"), sort_keys=True) if params else ""


def config_text(config: Mapping[str, Any]) -> str:
    """A config as the link carries it: its fields off their defaults, as compact JSON (validated)."""
    parsed = KVCacheConfig(**config)
    return json.dumps(parsed.model_dump(mode="json", exclude_defaults=True), separators=(",", ":"), sort_keys=True)


def request_body(view: PlaygroundView) -> dict[str, Any]:
    return {"model": view.model, "item": view.item(), "configs": view.configs()}


def result_rows(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per config: its answer, whether it is right, its measured cache and its fidelity."""
    rows = []
    for r in answer["results"]:
        verdict = "-" if r["score"] is None else ("right" if r["score"] >= 1 else "wrong")
        kv = fmt(r["physical_bytes"], ".3f", 1 / 2**20)
        rows.append({
            "config": r["config"], "answer": r["generated"].strip(), "verdict": verdict,
            # an endpoint's cache may be an estimate (kv_source says from what): marked as one
            "KV (MiB)": f"~{kv}" if r.get("kv_estimated") and kv != "-" else kv,
            "ratio (x)": fmt(r["compression_ratio"], ".2f"),
            "kept": fmt(r["kept_fraction"], ".0%"), "TTFT (ms)": fmt(r["ttft_s"], ".0f", 1000),
            "TPOT (ms)": fmt(r["tpot_s"], ".1f", 1000), "mean KL (nats)": fmt(r["mean_kl"], ".3g"),
            "top-1 agreement": fmt(r["agreement"], ".0%"),
        })
    return rows


def answer_span(item: Mapping[str, Any]) -> tuple[int, int] | None:
    """Where the expected answer (a passkey's needle) sits in the context, if it does."""
    answer = (item.get("answer") or "").strip()
    start = item["context"].find(answer) if answer else -1
    return (start, start + len(answer)) if start >= 0 else None


def kept_share(result: Mapping[str, Any], layer: int | None = None) -> list[float]:
    """For each prompt position, the share of heads that kept it: over every layer, or in ``layer``."""
    positions = KeptPositions.from_dict(result["kept_positions"])
    if layer is not None:
        positions = KeptPositions(positions.tokens, (positions.kept[layer],))
    return positions.share()


def token_map_html(context: str, offsets: Sequence[Sequence[int]], share: Sequence[float],
                   outline: tuple[int, int] | None) -> str:
    """The context's text, each token shaded by the share of heads that kept it (white: evicted everywhere,
    full blue: kept everywhere), the tokens of ``outline`` (the answer's span) boxed in red.  Every
    character of the text is escaped: it is the user's or the task's, shown as text."""
    pieces = []
    for (start, end), kept in zip(offsets, share, strict=False):
        if end <= start:
            continue  # a special token (the beginning of sequence) has no text
        boxed = outline is not None and start < outline[1] and end > outline[0]
        style = f"background:rgba(31,119,180,{kept:.2f})" + (";outline:2px solid #d62728" if boxed else "")
        pieces.append(f'<span title="kept by {kept:.0%} of heads" style="{style}">'
                      f"{html.escape(context[start:end])}</span>")
    return ('<div style="font-family:monospace;font-size:0.8rem;line-height:1.6;white-space:pre-wrap;'
            f'max-height:16rem;overflow-y:auto">{"".join(pieces)}</div>')


def spec_for(view: PlaygroundView, items: int = 10) -> dict[str, Any]:
    """The sweep "Save as experiment" opens: the playground's configs on ``items`` items of its task, or on every
    row of its file (the whole task, where the playground tried one item); on an endpoint, its own cache (the
    baseline: the configs need kvlab serve).  ``ValueError`` for the user's own text: a sweep runs a task (such
    texts run as a JSONL file in the data directory)."""
    if view.source == "text":
        raise ValueError("Save as experiment runs a whole task: pick a task or a JSONL file as the input (put your "
                         "own texts in a JSONL file in the data directory)")
    entry: dict[str, Any]
    if view.source == "file":
        entry = {"name": FILE_TASK, "path": view.file}
    else:
        entry = {"name": view.task, "context_lengths": [view.length], "num_items": items, **view.task_param_values()}
    if view.source == "task" and TASKS[view.task].needle_depths:  # its needle at five depths
        entry["depths"] = [0.1, 0.3, 0.5, 0.7, 0.9]
    if view.engine == "endpoint":
        return {"name": f"playground-{entry['name']}-endpoint", "model": view.model, "tasks": [entry],
                "configs": [{}],
                "backend": {"kind": "openai_compat", **({"base_url": view.base_url} if view.base_url else {}),
                            **({"model_id": view.model_id} if view.model_id else {})}}
    return {"name": f"playground-{entry['name']}", "model": view.model, "tasks": [entry],
            "configs": [dict(config) for config in view.configs()]}
