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
from kvlab.core.limits import PLAYGROUND_CONFIGS, PLAYGROUND_NEW_TOKENS
from kvlab.core.model_registry import DEFAULT_MODEL, KNOWN_MODELS
from kvlab.core.results import KeptPositions
from kvlab.core.tasks import FILE_TASK, TASKS, generated_tasks
from kvlab.core.urls import strip_credentials
from kvlab.dashboard.formatting import fmt
from kvlab.dashboard.task_params import ParamWidget, item_param_widgets
from kvlab.tasks.data_dir import checked_data_file
from kvlab.tasks.jsonl import DEFAULT_MAX_NEW_TOKENS, read_row

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
#: New tokens an answer to the user's own text may take, unless the page says otherwise (a JSONL row's default).
OWN_TEXT_NEW_TOKENS = DEFAULT_MAX_NEW_TOKENS
#: The largest whole number a number widget holds (the browser's exact integers): a seed's or a row's ceiling.
MAX_WHOLE = 2**53 - 1
#: Each number a link sets, with the range of its widget on the page (which uses these): a link's value outside it
#: is said in one line and left at its default, never handed to a widget that would stop the page.
NUMBER_RANGES: dict[str, tuple[int | float, int | float]] = {
    "length": (64, 8192), "depth": (0.0, 1.0), "seed": (0, MAX_WHOLE), "row": (1, MAX_WHOLE),
    "max_new_tokens": (1, PLAYGROUND_NEW_TOKENS)}
#: The most characters of the user's own text (context, question and answer together) a link carries: a longer
#: text stays on the page, and the link says that it is not in it (a share link is a line to paste, not a
#: document; the text's place is a JSONL file in the data directory, whose row a link names).
LINK_TEXT_CHARS = 300
#: The fields of the user's own text.
OWN_TEXT_FIELDS = ("context", "question", "answer")
#: Why "Save as experiment" is off for the user's own text.
OWN_TEXT_UNSAVED = ("Save as experiment runs a whole task: pick a task or a JSONL file as the input (put your own "
                    "texts in a JSONL file in the data directory)")


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
    max_new_tokens: int = OWN_TEXT_NEW_TOKENS  # the user's own text: the answer's budget
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
                if item.name in NUMBER_RANGES:
                    number = _link_number(item.name, text, type(getattr(default, item.name)))
                    if isinstance(number, str):
                        problems.append(number)
                    else:
                        values[item.name] = number
                    continue
                values[item.name] = type(getattr(default, item.name))(text)
            except (ValueError, TypeError) as error:
                problems.append(f"{item.name}: {str(error).splitlines()[0]} (left at its default)")
        for name, allowed in (("source", SOURCES), ("engine", ENGINES), ("model", tuple(KNOWN_MODELS)),
                              ("task", tuple(generated_tasks()))):
            if values.get(name, getattr(default, name)) not in allowed:
                problems.append(f"{name}: {values[name]!r} is not one of {', '.join(allowed)} (left at its default)")
                values[name] = getattr(default, name)
        if values.get("task_params"):
            values["task_params"], said = _params_in_range(values.get("task", default.task), values["task_params"])
            problems += said
        values["base_url"] = strip_credentials(values.get("base_url", ""))
        return cls(**values), problems

    def link(self) -> tuple[dict[str, str | list[str]], str | None]:
        """The share link's query parameters (:meth:`params`), and a line when the user's own text is left out of
        them for its length (over :data:`LINK_TEXT_CHARS` characters)."""
        params = self.params()
        chars = len(self.context) + len(self.question) + len(self.answer)
        if self.source != "text" or chars <= LINK_TEXT_CHARS:
            return params, None
        for name in OWN_TEXT_FIELDS:
            params.pop(name, None)
        return params, (f"Your text ({chars:,} characters) is not in the link: a link carries your own text up to "
                        f"{LINK_TEXT_CHARS} characters. To share a longer one, put it in a JSONL file in the data "
                        "directory and link its row.")

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


def _link_number(name: str, text: str, kind: type) -> int | float | str:
    """A link's number ``name`` as ``kind``, or the line that says why it is left at its default (not a number,
    not whole, or out of :data:`NUMBER_RANGES`)."""
    low, high = NUMBER_RANGES[name]
    shown = f"{name}={text[:40]}{'...' if len(text) > 40 else ''}"
    try:
        number = float(text)
    except ValueError:
        return f"{shown} is not a number; left at its default"
    if not low <= number <= high:  # NaN too
        return f"{shown} is out of range ({low:,}-{high:,}); left at its default"
    if kind is int and not number.is_integer():
        return f"{shown} is not a whole number; left at its default"
    return int(text) if kind is int and text.strip().lstrip("+-").isdigit() else kind(number)


def _params_in_range(task: str, text: str) -> tuple[str, list[str]]:
    """A link's task parameters less those the task's widgets cannot show, each said in one line."""
    params, problems = json.loads(text), []
    for widget in item_param_widgets(TASKS[task].params):
        if widget.name in params and (wrong := _param_problem(widget, params[widget.name])):
            problems.append(f"task_params: {widget.name}={json.dumps(params.pop(widget.name))[:40]} {wrong}; "
                            "left at its default")
    return (json.dumps(params, separators=(",", ":"), sort_keys=True) if params else ""), problems


def _param_problem(widget: ParamWidget, value: Any) -> str | None:
    """Why a task parameter's widget cannot show ``value`` (None when it can): a number out of its range, not a
    number or not whole, or not one of a choice's options."""
    if widget.kind == "choice":
        return None if value is None or value in widget.options else f"is not one of {widget.options}"
    if widget.kind not in ("int", "float"):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "is not a number"
    low, high = widget.bounds
    if not (low is None or value >= low) or not (high is None or value <= high) or value != value:
        return f"is out of range ({'' if low is None else low}-{'' if high is None else high})"
    return "is not a whole number" if widget.kind == "int" and not float(value).is_integer() else None


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
    """``POST /kvlab/playground``'s body (the user's own text with its answer's budget; a task's or a file's item
    with its own)."""
    budget = {"max_new_tokens": view.max_new_tokens} if view.source == "text" else {}
    return {"model": view.model, "item": view.item(), "configs": view.configs(), **budget}


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


def answer_spans(item: Mapping[str, Any]) -> list[tuple[int, int]]:
    """Where the expected answer (a passkey's needle) sits in the context: every occurrence, in order."""
    answer = (item.get("answer") or "").strip()
    spans: list[tuple[int, int]] = []
    start = item["context"].find(answer) if answer else -1
    while start >= 0:
        spans.append((start, start + len(answer)))
        start = item["context"].find(answer, start + len(answer))
    return spans


def kept_share(result: Mapping[str, Any], layer: int | None = None) -> list[float]:
    """For each prompt position, the share of heads that kept it: over every layer, or in ``layer``."""
    positions = KeptPositions.from_dict(result["kept_positions"])
    if layer is not None:
        positions = KeptPositions(positions.tokens, (positions.kept[layer],))
    return positions.share()


#: A token kept by every head is shaded this strongly (0-1): light enough that black text stays readable on it.
KEPT_ALPHA = 0.45
#: The map's blue (matplotlib's first colour, the dashboard's charts' too) and the answer's outline.
KEPT_RGB, OUTLINE = "31,119,180", "#d62728"


def shade(kept: float) -> str:
    """A token's background for the share of heads that kept it: white (none) to :data:`KEPT_ALPHA` blue (all)."""
    return f"rgba({KEPT_RGB},{kept * KEPT_ALPHA:.2f})"


def token_map_legend() -> str:
    """What the map's colours and outline mean, as swatches."""
    def swatch(background: str, label: str, border: str = "1px solid #999") -> str:
        return (f'<span style="display:inline-block;padding:0 0.4em;margin-right:0.8em;background:{background};'
                f'border:{border};border-radius:2px">{label}</span>')
    return ('<div data-kvlab-legend style="font-size:0.8rem;margin:0.2rem 0 0.6rem">'
            + swatch(shade(1.0), "kept by every head") + swatch(shade(0.5), "by half of them")
            + swatch("#fff", "evicted by every head")
            + swatch("#fff", "the expected answer (each time it occurs)", f"2px solid {OUTLINE}")
            + "</div>")


def token_map_html(context: str, offsets: Sequence[Sequence[int]], share: Sequence[float],
                   outlines: Sequence[tuple[int, int]], number: int = 0) -> str:
    """The context's text, each token shaded by the share of heads that kept it (:func:`shade`), each occurrence
    of ``outlines`` (the answer's spans) in one red box around its tokens.  The map scrolls, and opens scrolled
    to the first occurrence (its script, the one line of code in it: every character of the text is escaped,
    the user's or the task's, shown as text; ``number`` tells the page's maps apart)."""
    pieces = []
    inside: int | None = None  # the occurrence whose box is open
    for (start, end), kept in zip(offsets, share, strict=False):
        if end <= start:
            continue  # a special token (the beginning of sequence) has no text
        occurrence = next((i for i, (low, high) in enumerate(outlines) if start < high and end > low), None)
        if occurrence != inside:
            if inside is not None:
                pieces.append("</span>")
            if occurrence is not None:
                pieces.append(f'<span data-kvlab-answer style="outline:2px solid {OUTLINE};outline-offset:1px;'
                              'border-radius:2px">')
            inside = occurrence
        pieces.append(f'<span title="kept by {kept:.0%} of heads" style="background:{shade(kept)}">'
                      f"{html.escape(context[start:end])}</span>")
    if inside is not None:
        pieces.append("</span>")
    map_id = f"kvlab-token-map-{number}"
    scroll = (f"<script>(() => {{const map = document.getElementById('{map_id}');"
              " const answer = map && map.querySelector('[data-kvlab-answer]');"
              " if (answer) map.scrollTop = Math.max(0, answer.offsetTop - map.clientHeight / 3);})();</script>")
    return (f'<div id="{map_id}" data-kvlab-map style="position:relative;font-family:monospace;font-size:0.8rem;'
            f'line-height:1.6;white-space:pre-wrap;max-height:16rem;overflow-y:auto;padding:2px">{"".join(pieces)}'
            f"</div>{scroll}")


def progress_text(progress: Mapping[str, Any], model: str) -> tuple[str, float]:
    """A Run in flight, in words (what the server is doing, the configs answered so far), and its share done."""
    answered, total = list(progress.get("answered") or []), int(progress.get("total") or 0)
    phase, config = progress.get("phase"), progress.get("config")
    doing = {
        "sent": "Sending the Run...",
        "starting": f"Starting `kvlab serve` for {model} (loading the model: the first Run only)...",
        "queued": "Waiting for the server: it is answering another request...",
        "prefill": f"Prefilling the context ({int(progress.get('context_tokens') or 0):,} tokens)...",
        "compress": f"Compressing the cache: {config}..." if config else "Compressing the cache...",
        "decode": f"Decoding {config}..." if config else "Decoding the configs together...",
    }.get(str(phase), "Running...")
    if not total:
        return doing, 0.0
    done = f"{len(answered)} of {total} configs answered" + (f" ({', '.join(answered)})" if answered else "")
    return f"{done} · {doing}", len(answered) / total


def empty_answer_hint(answer: Mapping[str, Any], max_new_tokens: int) -> str | None:
    """Why the baseline answered nothing, and what to try, when it did (None when it said something)."""
    baseline = answer["results"][0]
    if baseline["generated"].strip():
        return None
    tokens = int(baseline.get("output_tokens") or 0)
    if tokens >= max_new_tokens:
        why = (f"its {tokens} new tokens (all that Max new tokens allows) were blank space" if tokens > 1 else
               "its one new token (all that Max new tokens allows) was blank space")
    elif tokens <= 1:
        why = "the model stopped at once (its end token came first)"
    else:
        why = f"it wrote only blank space (line breaks, spaces) in {tokens} tokens, then stopped"
    why += ("; a base model continues text rather than answering: end the question where the answer comes next "
            "(e.g. \"Question: ... Answer:\"), put the answer's first word in it, or raise Max new tokens")
    return f"The baseline answered nothing: {why}. The configs are compared with it, so their answers say little."


def spec_for(view: PlaygroundView, items: int = 10) -> dict[str, Any]:
    """The sweep "Save as experiment" opens: the playground's configs on ``items`` items of its task, or on every
    row of its file (the whole task, where the playground tried one item); on an endpoint, its own cache (the
    baseline: the configs need kvlab serve).  ``ValueError`` for the user's own text: a sweep runs a task (such
    texts run as a JSONL file in the data directory)."""
    if view.source == "text":
        raise ValueError(OWN_TEXT_UNSAVED)
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
