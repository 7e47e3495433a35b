"""The "new experiment" form as plain data: form values <-> :class:`ExperimentSpec`, field by field.

The form keeps one value per widget, keyed by the spec's own field path (``tasks.0.context_lengths``),
so a validation error from kvlab's pydantic models (``format_validation_error`` prints the same
paths) lands next to the widget it is about.  A task's own parameters have a widget each, drawn from
its parameter model (:mod:`kvlab.dashboard.task_params`).  Settings the form has no widget for (a
backend's ``base_url``, ...) ride along unchanged in ``base``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel

from kvlab.core.axes import AXES, CONFIG_LABELS, LEAVES, NESTED_COLUMNS, Axis
from kvlab.core.axis import shape
from kvlab.core.backends import BACKENDS, server_kinds
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ExperimentSpec, parse_spec, spec_to_dict
from kvlab.core.kv_config import GridAxes, KVCacheConfig, SweepGrid
from kvlab.core.margins import Margins
from kvlab.core.methods import BUDGET_BOUNDS
from kvlab.core.tune_spec import TuneSpec
from kvlab.dashboard.formatting import md
from kvlab.dashboard.page_keys import key_caption
from kvlab.dashboard.task_params import param_values, params_from_values
from kvlab.engines.server_flags import check_config
from kvlab.experiments.submit import queued_key_problem
from kvlab.paths import EXAMPLES_DIR
from kvlab.secrets import BASE_URL_VAR, DEFAULT_KEY_VAR, key_var_problem, read_setting

#: A configs-table row's defaults (the columns are the axes table's: :data:`kvlab.core.axes.CONFIG_COLUMNS`).
_CONFIG_DEFAULTS = {k: v for k, v in KVCacheConfig().model_dump(mode="json").items() if k not in NESTED_COLUMNS}
#: The grid's defaults are the model's; quant and evict suggest a small grid instead of the model's
#: ["none"] (a grid of the baseline alone shows nothing).
_SWEEP_DEFAULTS = SweepGrid().model_dump(mode="json") | {"quant": ["none", "int4", "int2"],
                                                         "evict": ["none", "snapkv"]}
#: The budget columns' bounds and step: every budget is a fraction in (0, 1), both ends excluded,
#: which a number column (inclusive bounds) shows as [step, 1 - step].
BUDGET_STEP = 0.01
BUDGET_RANGE = (BUDGET_BOUNDS[0] + BUDGET_STEP, BUDGET_BOUNDS[1] - BUDGET_STEP)

#: The form's modes: a sweep runs the configs listed (and the grid); a tune searches the [tune] space.
MODES = ("Sweep", "Tune")
#: The Tune mode's defaults are TuneSpec's, with one eviction method to search (its default is none).
_TUNE_DEFAULTS = TuneSpec().model_dump(mode="json") | {"evict": ["none", "snapkv"]}
#: Tune fields where the form's 0 means "no limit" (None in the spec), with their widgets' labels,
#: which the form's messages use too (the spec's keys mean nothing on the page).
TUNE_LABELS = {"max_trials": "Max candidates", "max_minutes": "Max minutes", "max_item_evals": "Max item evaluations",
               "max_ttft_ms": "Max TTFT (ms)", "max_tpot_ms": "Max TPOT (ms)"}
TUNE_OPTIONAL = tuple(TUNE_LABELS)
TUNE_COUNTS = ("max_trials", "max_item_evals")  # whole numbers; the others are minutes and milliseconds
TUNE_BUDGETS = ("max_trials", "max_minutes", "max_item_evals")  # the search stops at the first one reached
#: Fields the form shows as a table, one row per entry: a message about an entry says its row (from 1) and column.
TABLES = {"configs": CONFIG_LABELS}

#: A grid widget's kind: a list of choices, a list of numbers typed as text, one choice, one number, yes/no,
#: or a list of tables with no widget (carried from the spec and shown).
GridKind = Literal["multiselect", "numbers", "select", "number", "checkbox", "carried"]
GRID_MODELS: dict[str, type[GridAxes]] = {"sweep": SweepGrid, "tune": TuneSpec}


@dataclass(frozen=True)
class GridWidget:
    """A widget of the ``[sweep]`` or ``[tune]`` table's axes: the table key, its heading, the axis it lists
    and how it is entered, derived from the axes table and the grid model's field."""

    key: str
    title: str
    axis: Axis
    kind: GridKind
    options: tuple[Any, ...] = ()
    item: type = float  # a number list's items
    required: bool = False  # at least one value
    help: str = ""  # the grid field's description, then the axis's longer help


def grid_widgets(table: str) -> tuple[GridWidget, ...]:
    """The widgets of ``table`` ("sweep" or "tune"), one per axis it lists, in the axes table's order."""
    model = GRID_MODELS[table]
    widgets = []
    for axis in AXES:
        key = axis.sweep if table == "sweep" else axis.tune
        if key is None:
            continue
        info = model.model_fields[key]
        annotation, _ = shape(info.annotation)
        required = any(getattr(m, "min_length", 0) for m in info.metadata)
        kind: GridKind
        options: tuple[Any, ...] = ()
        item: type = float
        if get_origin(annotation) is list:
            inner, _ = shape(get_args(annotation)[0])
            if get_origin(inner) is Literal:
                kind, options = "multiselect", get_args(inner)
            elif inner is bool:  # settings each config is also run with (rotation)
                kind, options = "multiselect", (True, False)
            elif isinstance(inner, type) and issubclass(inner, BaseModel):
                kind = "carried"
            else:
                kind, item = "numbers", inner
        elif get_origin(annotation) is Literal:
            kind, options = "select", get_args(annotation)
        else:
            kind = "checkbox" if annotation is bool else "number"
        text = " ".join(part for part in (info.description, axis.form_help) if part)
        widgets.append(GridWidget(key, axis.grid_heading, axis, kind, options, item, required, text))
    return tuple(widgets)


def grid_values(table: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The widget values of ``table``'s axes from its spec table (a number list as ``"0.25, 0.5"``)."""
    values: dict[str, Any] = {}
    for widget in grid_widgets(table):
        value = data[widget.key]
        if widget.kind == "multiselect":
            values[f"{table}.{widget.key}"] = list(value)
        elif widget.kind == "numbers":
            values[f"{table}.{widget.key}"] = _join(value)
        elif widget.kind != "carried":
            values[f"{table}.{widget.key}"] = value
    return values


def grid_from_values(table: str, values: Mapping[str, Any], defaults: Mapping[str, Any],
                     errors: dict[str, list[str]]) -> dict[str, Any]:
    """``table``'s axes from the widgets (a widget not drawn keeps ``defaults``), and the problems the form
    itself finds by field path (a list left empty, a number that is not one)."""
    out: dict[str, Any] = {}
    for widget in grid_widgets(table):
        path = f"{table}.{widget.key}"
        value = values.get(path, defaults.get(widget.key))
        if widget.kind == "carried":
            continue
        if widget.kind == "numbers":
            try:
                value = parse_numbers(str(value if isinstance(value, str) else _join(value or [])), widget.item)
            except ValueError as error:
                errors.setdefault(path, []).append(str(error))
                continue
        elif widget.kind == "multiselect":
            value = list(value or [])
            if widget.required and not value:
                errors.setdefault(path, []).append("pick at least one")
        elif widget.kind == "checkbox":
            value = bool(value)
        elif widget.kind == "number" or (widget.kind == "select" and isinstance(widget.options[0], int)):
            value = int(value)
        out[widget.key] = value
    return out


DEFAULT_SPEC: dict[str, Any] = {
    "name": "my-sweep", "model": "smollm2-135m",
    "tasks": [{"name": "passkey", "context_lengths": [1024], "depths": [0.1, 0.5, 0.9], "num_items": 5}],
    "configs": [{"name": "int4", "quant": "int4"}, {"name": "streaming-50", "evict": "streaming_llm", "ratio": 0.5}],
}
#: A new task section's task.
DEFAULT_TASK: str = DEFAULT_SPEC["tasks"][0]["name"]


@dataclass
class SpecForm:
    """What the form shows: ``values`` by field path, ``n_tasks`` task sections, the configs table's
    rows, and ``base``: the spec dict the form was filled from (fields without a widget)."""

    values: dict[str, Any]
    n_tasks: int
    configs: list[dict[str, Any]]
    base: dict[str, Any] = field(default_factory=dict)


@dataclass
class FormResult:
    """A valid spec, or the problems by field path (``spec`` for the whole spec)."""

    spec: ExperimentSpec | None
    errors: dict[str, list[str]]


def form_from_spec(spec: ExperimentSpec | Mapping[str, Any]) -> SpecForm:
    data = spec_to_dict(spec) if isinstance(spec, ExperimentSpec) else dict(spec)
    backend = data.get("backend", {})
    server = backend.get("server", {})
    values: dict[str, Any] = {
        "name": data.get("name", "experiment"), "model": data.get("model", "smollm2-135m"),
        "backend.kind": backend.get("kind", "embedded"), "backend.device": backend.get("device", "auto"),
        "backend.base_url": backend.get("base_url") or "", "backend.model_id": backend.get("model_id") or "",
        "backend.api_key_env": backend.get("api_key_env", DEFAULT_KEY_VAR),
        "backend.max_concurrency": int(backend.get("max_concurrency", 4)),
        "backend.server.python": server.get("python") or "",
        "backend.server.memory_fraction": float(server.get("memory_fraction") or 0.0),
        "backend.server.kv_cache_gib": float(server.get("kv_cache_gib") or 0.0),
        "backend.server.max_model_len": int(server.get("max_model_len") or 0),
        "backend.server.prefix_cache": bool(server.get("prefix_cache", True)),
        "seed": int(data.get("seed", 0)), "tags": ", ".join(data.get("tags", [])), "notes": data.get("notes", ""),
        **margin_values(data),
    }
    tasks = data.get("tasks", [])
    for index, task in enumerate(tasks):
        prefix = f"tasks.{index}."
        values |= {
            prefix + "name": task.get("name", DEFAULT_TASK),
            prefix + "context_lengths": _join(task.get("context_lengths", [1024])),
            prefix + "num_items": int(task.get("num_items") or 0),  # 0: unset (the task's default)
            prefix + "max_new_tokens": int(task.get("max_new_tokens") or 0),
        } | param_values(prefix, task)  # its own parameters, a widget each
    sweep = _SWEEP_DEFAULTS | (data.get("sweep") or {})
    values |= {"sweep.on": data.get("sweep") is not None, **grid_values("sweep", sweep)}
    values |= tune_values(data.get("tune"))
    configs = config_rows(data.get("configs", []))
    return SpecForm(values=values, n_tasks=len(tasks), configs=configs, base=data)


def margin_values(source: Mapping[str, Any]) -> dict[str, float]:
    """The sweet-spot rule's margins (``max_drop``, ``max_kl``, ``min_agreement``) from a spec dict or the
    form's values, each absent one at the spec's default; a 0 (a fidelity margin off) stays 0."""
    return asdict(Margins.of(source))


def tune_values(tune: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Tune mode's widget values (``mode`` is Tune when the spec has a ``[tune]`` table)."""
    data = _TUNE_DEFAULTS | dict(tune or {})
    low, high = data["budget_range"]
    return {"mode": MODES[1] if tune is not None else MODES[0], **grid_values("tune", data),
            "tune.budget": data["budget"], "tune.budget_low": float(low), "tune.budget_high": float(high),
            "tune.budget_step": float(data["budget_step"]),
            **{f"tune.{key}": (int if key in TUNE_COUNTS else float)(data[key] or 0) for key in TUNE_OPTIONAL}}


def tune_from_values(values: Mapping[str, Any],
                     base: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The ``[tune]`` table from the Tune mode's widgets (fields without one, such as ``eta``, ride
    along from ``base``), and the problems the form itself finds, by field path."""
    errors: dict[str, list[str]] = {}
    tune = dict(base or {}) | grid_from_values("tune", values, _TUNE_DEFAULTS, errors)
    tune |= {"budget": values.get("tune.budget", _TUNE_DEFAULTS["budget"]),
             "budget_range": [float(values.get("tune.budget_low", _TUNE_DEFAULTS["budget_range"][0])),
                              float(values.get("tune.budget_high", _TUNE_DEFAULTS["budget_range"][1]))],
             "budget_step": float(values.get("tune.budget_step", _TUNE_DEFAULTS["budget_step"]))}
    for key in TUNE_OPTIONAL:
        number = values.get(f"tune.{key}") or 0
        if number < 0:
            whole = "a whole number from 1" if key in TUNE_COUNTS else "a positive number"
            errors[f"tune.{key}"] = [f"{TUNE_LABELS[key]} is {number:g}: give {whole}, or 0 for no limit"]
        tune[key] = (int if key in TUNE_COUNTS else float)(number) or None
    if all(tune[key] is None for key in TUNE_BUDGETS):
        errors["tune"] = [f"give the search a budget: set {', '.join(TUNE_LABELS[k] for k in TUNE_BUDGETS[:-1])} or "
                          f"{TUNE_LABELS[TUNE_BUDGETS[-1]]} above 0 (0 is no limit)"]
    return tune, errors


def default_form() -> SpecForm:
    return form_from_spec(DEFAULT_SPEC)


def empty_task_values(index: int) -> dict[str, Any]:
    """Widget values of a newly added task section."""
    return {key.replace("tasks.0.", f"tasks.{index}.", 1): value
            for key, value in form_from_spec(DEFAULT_SPEC).values.items() if key.startswith("tasks.0.")}


def backend_from_values(values: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """The ``[backend]`` table: only the fields the chosen kind uses (the others are refused)."""
    kind = values.get("backend.kind", "embedded")
    reads = BACKENDS[kind].fields
    backend = {k: v for k, v in base.items() if k not in ("base_url", "model_id", "server")} | {"kind": kind}
    if BACKENDS[kind].loads_model_here:
        return backend | {"device": values.get("backend.device", "auto")}
    backend |= {"api_key_env": str(values.get("backend.api_key_env") or DEFAULT_KEY_VAR).strip(),
                "max_concurrency": int(values.get("backend.max_concurrency") or 1)}
    for name in ("model_id", "base_url"):
        if name in reads and str(values.get(f"backend.{name}") or "").strip():
            backend[name] = str(values[f"backend.{name}"]).strip()
    if "server" not in reads:
        return backend
    server = dict(base.get("server", {})) | {
        "python": str(values.get("backend.server.python") or "").strip() or None,  # blank: kvlab's install
        "prefix_cache": bool(values.get("backend.server.prefix_cache", True))}
    server["memory_fraction"] = float(values.get("backend.server.memory_fraction") or 0) or None
    server["kv_cache_gib"] = float(values.get("backend.server.kv_cache_gib") or 0) or None
    server["max_model_len"] = int(values.get("backend.server.max_model_len") or 0) or None
    return backend | {"server": {k: v for k, v in server.items() if v is not None}}


def build_spec(values: Mapping[str, Any], n_tasks: int, configs: Sequence[Mapping[str, Any]],
               base: Mapping[str, Any] | None = None) -> FormResult:
    """Validate the form: list fields are parsed here (``"1024, 2048"``), everything else by
    :func:`kvlab.core.experiment_spec.parse_spec`, whose messages are split back onto the fields."""
    base = dict(base or {})
    errors: dict[str, list[str]] = {}

    def numbers(key: str, kind: type) -> list[Any]:
        try:
            return parse_numbers(str(values.get(key, "")), kind)
        except ValueError as error:
            errors.setdefault(key, []).append(str(error))
            return []

    base_tasks = base.get("tasks", [])
    tasks = []
    for index in range(n_tasks):
        prefix = f"tasks.{index}."
        name = values.get(prefix + "name", DEFAULT_TASK)
        base_task = base_tasks[index] if index < len(base_tasks) else {}
        own, problems = params_from_values(prefix, name, values, base_task if base_task.get("name") == name else {})
        errors |= problems
        task = {"name": name, "context_lengths": numbers(prefix + "context_lengths", int),
                "num_items": int(values.get(prefix + "num_items") or 0) or None,
                "max_new_tokens": int(values.get(prefix + "max_new_tokens") or 0) or None, **own}
        tasks.append({k: v for k, v in task.items() if v is not None})

    data: dict[str, Any] = {k: v for k, v in base.items() if k not in ("sweep", "configs", "tasks", "tune")}
    data |= {
        "name": str(values.get("name", "")).strip() or "experiment",
        "model": str(values.get("model") or "").strip(),
        "seed": int(values.get("seed", 0)),
        **margin_values(values),
        "tags": [t.strip() for t in str(values.get("tags", "")).split(",") if t.strip()],
        "notes": str(values.get("notes", "")),
        "backend": backend_from_values(values, base.get("backend", {})),
        "tasks": tasks,
        "configs": [row for row in (config_row(c) for c in configs) if row is not None],
    }
    if not data["model"]:
        errors.setdefault("model", []).append("give a registry name (smollm2-135m), a local directory or a .gguf file")
    if values.get("mode") == MODES[1]:  # a tune searches its space: the configs table and the grid stay out
        data["configs"] = []
        data["tune"], problems = tune_from_values(values, base.get("tune"))
        errors |= problems
    elif values.get("sweep.on"):
        data["sweep"] = grid_from_values("sweep", values, _SWEEP_DEFAULTS, errors)
        for widget in grid_widgets("sweep"):  # no widget: carried from the spec, shown
            if widget.kind == "carried" and (carried := (base.get("sweep") or {}).get(widget.key)):
                data["sweep"][widget.key] = carried
    if errors:
        return FormResult(None, errors)
    try:
        spec = parse_spec(data)
    except ConfigError as error:
        return FormResult(None, _table_rows(split_errors(str(error)), configs))
    refused = backend_refusals(spec)
    return FormResult(None, {"configs": refused}) if refused else FormResult(spec, {})


def _table_rows(errors: dict[str, list[str]], table: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The errors with ``configs.N`` counting the configs table's rows (empty rows are not configs)."""
    rows = [index for index, row in enumerate(table) if config_row(row) is not None]
    renamed: dict[str, list[str]] = {}
    for path, messages in errors.items():
        parts = path.split(".")
        if parts[0] == "configs" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < len(rows):
            path = ".".join(["configs", str(rows[int(parts[1])]), *parts[2:]])
        renamed.setdefault(path, []).extend(messages)
    return renamed


def backend_refusals(spec: ExperimentSpec) -> list[str]:
    """Configs a launched vLLM/SGLang server cannot run, said before launch (the worker would refuse them)."""
    if spec.backend.kind not in server_kinds():
        return []
    problems = []
    for config in spec.all_configs():
        try:
            check_config(spec.backend.kind, config)
        except ConfigError as error:
            problems.append(str(error))
    return problems


def key_line(kind: str, key_var: str, base_url: str) -> str:
    """One line (Markdown) under the backend's fields, before Launch: whether the run's workers will send the
    dashboard's key and where, as the playground says it (:func:`kvlab.dashboard.page_keys.key_caption`), or why
    Launch refuses to queue the run (:func:`kvlab.experiments.submit.queued_key_problem`)."""
    if "api_key_env" not in BACKENDS[kind].fields:
        return "Key: none. kvlab launches this server on the worker's host and sends it no key."
    key_var = key_var.strip() or DEFAULT_KEY_VAR
    url = base_url.strip() or read_setting(BASE_URL_VAR)[0] or ""
    if url and not key_var_problem(key_var) and (problem := queued_key_problem(kind, key_var, url)):
        return f"Key: Launch refuses this run. {md(problem)}."
    if url or key_var_problem(key_var) or not read_setting(key_var)[0]:
        return key_caption(key_var, url)
    return f"Key: none yet. Give the base URL: {md(key_var)}'s key goes only to the URL it belongs to."


def config_rows(configs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Configs as the configs table's rows: every field at its value or default, nested tables flattened."""
    return [_CONFIG_DEFAULTS | {"name": ""} | _flat_nested(c) for c in configs]


def named_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The configs table's rows as the form opens them: a nameless row named as the spec would name it, from its
    settings (``int4/g64/r64``: the label its results carry, unique as the spec wants names), so that no row
    opens nameless; a name the row has is kept as it is, and a row that is not a config stays nameless (its
    row's error says why)."""
    named = []
    for row in rows:
        name = row.get("name")
        if _blank(name) and (config := config_row(row)) is not None:
            with contextlib.suppress(ValueError):  # pydantic's ValidationError too
                name = KVCacheConfig(**config).label
        named.append({**row, "name": "" if _blank(name) else name})
    return named


def _flat_nested(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict with its nested tables as the table's ``<prefix>_<field>`` columns (a list of layer
    indices as comma-separated text)."""
    flat = {k: v for k, v in config.items() if k not in NESTED_COLUMNS}
    for key, (prefix, _) in NESTED_COLUMNS.items():
        flat |= {f"{prefix}{k}": _join(v) if isinstance(v, list | tuple) else v
                 for k, v in (config.get(key) or {}).items()}
    return flat


def config_row(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """A configs-table row as a KVCacheConfig dict: blanks dropped, the ``<prefix>_<field>`` columns
    nested as its tables; None for an empty row.  Layer indices that are not whole numbers stay text, which
    validation refuses on their row and column."""
    clean = {k: v for k, v in row.items() if not _blank(v) and k not in NESTED_COLUMNS}
    if not any(k in clean for k in ("name", "quant", "evict")):
        return None
    for leaf in (leaf for leaf in LEAVES if leaf.column in clean):
        if leaf.kind == "int" or (leaf.kind == "choice" and isinstance(leaf.choices[0], int)):
            clean[leaf.column] = int(clean[leaf.column])
        elif leaf.kind == "bool":
            clean[leaf.column] = bool(clean[leaf.column])
        elif leaf.kind == "ints":
            with contextlib.suppress(ValueError):
                clean[leaf.column] = parse_numbers(str(clean[leaf.column]), int)
    for key, (prefix, model) in NESTED_COLUMNS.items():
        nested = {name: clean.pop(prefix + name) for name in model.model_fields if prefix + name in clean}
        if nested:
            clean[key] = nested
    return clean


def _blank(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


def split_errors(message: str) -> dict[str, list[str]]:
    """``format_validation_error`` lines (``path: message``) grouped by path."""
    errors: dict[str, list[str]] = {}
    for line in message.splitlines():
        path, sep, text = line.partition(": ")
        if not sep or " " in path:
            path, text = "spec", line
        errors.setdefault(path, []).append(text)
    return errors


def assign_errors(errors: Mapping[str, list[str]], keys: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Give each error to the most specific field key that contains its path (``tasks.0.depths.1``
    goes to ``tasks.0.depths`` before ``tasks.0``); the rest, with their paths, are returned apart."""
    by_key: dict[str, list[str]] = {}
    rest = []
    for path, messages in errors.items():
        owner = max((k for k in keys if path == k or path.startswith(k + ".")), key=len, default=None)
        for message in messages:
            if owner is None:
                rest.append(message if path == "spec" else f"{path}: {message}")
            else:
                inner = _where(owner, path.removeprefix(owner).lstrip("."))
                by_key.setdefault(owner, []).append(f"{inner}: {message}" if inner else message)
    return by_key, rest


def _where(owner: str, inner: str) -> str:
    """Where in a field a problem is, in the form's words: ``row 2: ratio (removed)`` in a table (its
    rows counted from 1, its columns by label), ``value 2`` of a comma-separated list; else the path."""
    head, _, rest = inner.partition(".")
    if not head.isdigit():
        return inner
    if owner in TABLES:
        column, _, deeper = rest.partition(".")
        if column in NESTED_COLUMNS and deeper:  # a nested table's fields are columns of their own
            column, _, deeper = f"{NESTED_COLUMNS[column][0]}{deeper}".partition(".")
        label = TABLES[owner].get(column, column) + (f".{deeper}" if deeper else "")
        return f"row {int(head) + 1}" + (f": {label}" if label else "")
    return f"value {int(head) + 1}" + (f".{rest}" if rest else "")


def parse_numbers(text: str, kind: type = float) -> list[Any]:
    """``"1024, 2048"`` -> ``[1024, 2048]``; a ValueError naming the bad entry otherwise."""
    out = []
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(kind(part))
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise ValueError(f"{part!r} is not {what}; separate values with commas") from None
    if not out:
        raise ValueError("give at least one value")
    return out


def _join(values: Sequence[Any]) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def list_examples() -> dict[str, Path]:
    """The example specs shipped in ``examples/``, by file stem; ``tiny`` first (it runs in a minute)."""
    paths = sorted(EXAMPLES_DIR.glob("*.toml"), key=lambda p: (p.stem != "tiny", p.stem))
    return {p.stem: p for p in paths}
