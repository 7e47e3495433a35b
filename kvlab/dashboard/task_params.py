"""A task's parameter widgets, read from its parameter model alone (no streamlit here).

Each field of a task's model (:attr:`kvlab.core.tasks.Task.params`) is one widget, told from the
field's JSON schema: a whole number is a number input with the field's bounds and step, a number
one too, a yes/no a checkbox, a choice (a ``Literal``, or a schema ``enum``) a select box, a list of
numbers a comma-separated text, a file path (schema ``format: path``) the page's file field, any
other text a text input.  The new-experiment form and the playground draw them
(``pages/task_params.py``), keyed by the parameter's name, and read their values back through
:meth:`ParamWidget.parsed`; nothing here or there names a task or a parameter.  A field of another
shape gets no widget: the form carries its value from the spec it was filled from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kvlab.core.tasks import TASKS, FileParams, NeedleParams, SharedContextParams, TaskParams
from kvlab.tasks.data_dir import checked_data_file

WidgetKind = Literal["int", "float", "bool", "choice", "numbers", "text", "file"]
#: How a choice shows "unset" (None: the task's own default, which the help text says).
UNSET_CHOICE = ""


@dataclass(frozen=True)
class ParamWidget:
    """One parameter's widget: ``name`` (the spec key, and the last part of the widget's key), its ``label``
    and ``help`` (the field's title and description), its ``kind``, the model's ``default`` and, as the
    schema gives them, ``minimum``/``maximum``/``step`` (numbers) and ``options`` (a choice).  ``optional``:
    None is a value (unset), which a number widget shows as 0 and a choice as :data:`UNSET_CHOICE`."""

    name: str
    label: str
    help: str
    kind: WidgetKind
    default: Any
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    options: tuple[Any, ...] = ()
    optional: bool = False
    whole: bool = False  # numbers: whole numbers

    def shown(self, value: Any) -> Any:
        """A spec value as the widget holds it."""
        if self.kind in ("int", "float"):
            number = 0 if value is None else value
            return int(number) if self.kind == "int" else float(number)
        if self.kind == "bool":
            return bool(value)
        if self.kind == "numbers":
            return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value or [])
        if self.kind == "choice":
            return UNSET_CHOICE if value is None else value
        return "" if value is None else str(value)

    def parsed(self, value: Any) -> Any:
        """The widget's value as the spec's (None: unset, left out of the task's table); a ValueError in words
        for a text that is not what the field takes."""
        if self.kind in ("int", "float"):
            number = int(value or 0) if self.kind == "int" else float(value or 0)
            return None if self.optional and number == 0 else number
        if self.kind == "bool":
            return bool(value)
        if self.kind == "numbers":
            from kvlab.dashboard.spec_form import parse_numbers

            return parse_numbers(str(value or ""), int if self.whole else float)
        if self.kind == "choice":
            return None if value in (None, UNSET_CHOICE) else value
        text = str(value or "").strip()
        return text or None

    @property
    def choices(self) -> tuple[Any, ...]:
        """A choice's options as the select box lists them (unset first when the field may be unset)."""
        return (UNSET_CHOICE, *self.options) if self.optional else self.options

    @property
    def bounds(self) -> tuple[float | None, float | None]:
        """A number widget's (min, max): 0 is its lowest where it means unset."""
        return (0 if self.optional else self.minimum), self.maximum


def param_widgets(model: type[TaskParams]) -> list[ParamWidget]:
    """A widget for each field of ``model`` that has one, in the model's order."""
    properties = model.model_json_schema().get("properties", {})
    widgets = []
    for name, field in model.model_fields.items():
        widget = _widget(name, properties.get(name, {}), field.default if not field.is_required() else None)
        if widget is not None:
            widgets.append(widget)
    return widgets


def item_param_widgets(model: type[TaskParams]) -> list[ParamWidget]:
    """The widgets of the parameters that shape one item of a task (the playground's): not its needle's depths
    (an item has one depth, a widget of its own), its questions per context (an item is one question) or its
    file (a file's row is an input of its own)."""
    shared = {*NeedleParams.model_fields, *SharedContextParams.model_fields, *FileParams.model_fields}
    return [widget for widget in param_widgets(model) if widget.name not in shared]


def params_text(widgets: list[ParamWidget], values: Mapping[str, Any]) -> str:
    """``values`` (spec values by parameter name) off their defaults, as compact JSON ("" when none is):
    what a playground link carries."""
    changed = {w.name: values[w.name] for w in widgets if w.name in values and values[w.name] != w.default}
    return json.dumps(changed, separators=(",", ":"), sort_keys=True) if changed else ""


def _widget(name: str, schema: Mapping[str, Any], default: Any) -> ParamWidget | None:
    optional = False
    variants = schema.get("anyOf")
    if variants is not None:
        present = [v for v in variants if v.get("type") != "null"]
        if len(present) != 1 or len(present) == len(variants):
            return None  # a union of several kinds: no widget
        optional = True
        schema = {**present[0], **{k: v for k, v in schema.items() if k != "anyOf"}}
    common = {"name": name, "label": schema.get("title", name), "help": schema.get("description", ""),
              "default": default, "optional": optional}
    kind = schema.get("type")
    if "enum" in schema:
        return ParamWidget(kind="choice", options=tuple(schema["enum"]), **common)
    if kind == "boolean":
        return ParamWidget(kind="bool", **common)
    if kind in ("integer", "number"):
        whole = kind == "integer"
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        step = schema.get("multipleOf", 1 if whole else None)
        return ParamWidget(kind="int" if whole else "float", minimum=low, maximum=high, step=step, **common)
    if kind == "array" and schema.get("items", {}).get("type") in ("integer", "number"):
        return ParamWidget(kind="numbers", whole=schema["items"]["type"] == "integer", **common)
    if kind == "string":
        return ParamWidget(kind="file" if schema.get("format") == "path" else "text", **common)
    return None


# --- the new-experiment form's task sections ------------------------------------------------------------


def param_values(prefix: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """The form's values of a task's own parameters (``prefix``: its section's, ``tasks.0.``) from its table,
    each absent one at its default."""
    task = TASKS.get(table.get("name", ""))
    if task is None:
        return {}
    return {prefix + w.name: w.shown(table.get(w.name, w.default)) for w in param_widgets(task.params)}


def params_from_values(prefix: str, name: str, values: Mapping[str, Any],
                       carried: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Task ``name``'s own parameters from the form's ``values``, and the problems the form finds, by widget
    key.  ``carried``: the task's table the form was filled from (of the same task), whose parameters without
    a widget (or without a value in ``values``) ride along.  A file must be under the data directory: this is
    a web page."""
    task = TASKS.get(name)
    if task is None:
        return {}, {}  # validation names the unknown task
    table = {key: value for key, value in carried.items() if key in task.params.model_fields}
    errors: dict[str, list[str]] = {}
    for widget in param_widgets(task.params):
        key = prefix + widget.name
        if key not in values:
            continue
        try:
            value = widget.parsed(values[key])
            if widget.kind == "file" and value is not None:
                value = checked_data_file(value)
        except ValueError as error:  # ConfigError too
            errors[key] = [str(error)]
            continue
        table.pop(widget.name, None)
        if value is not None:
            table[widget.name] = value
    return table, errors
