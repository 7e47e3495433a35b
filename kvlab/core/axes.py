"""The table of config axes: every field of :class:`~kvlab.core.kv_config.KVCacheConfig`, once, with what
each consumer needs to know of it, read from the field's own declaration (:class:`~kvlab.core.axis.Axis`).

An axis is one config field: its heading and help, the ``[sweep]`` and ``[tune]`` keys that list it, whether
the configs table shows it as a column and whether ``kvlab serve`` takes it as an option, and *when it
applies* (a setting only to the formats that read it, a budget only with a method).  Its type, allowed
values, bounds and default are the field's own (``KVCacheConfig.model_fields``): :func:`leaves` reads them
from there.  A nested table (a decode policy, the 16-bit layers) is one axis whose fields are flattened into
one :class:`Leaf` each, with their own models' titles and descriptions.

What is derived from this table: ``kvlab serve``'s KV options and their inverse (the recommendation's
``serve_command``), the configs table's columns, headings, widgets and the coercion of its cells (the form
and the playground), and the sweep's and the tune's widgets.  The registries the settings, budgets and
method parameters come from stay the one place of their vocabularies: a new format setting, budget kind or
method parameter is one entry of :data:`~kvlab.core.formats.SETTINGS`, :data:`~kvlab.core.methods.BUDGETS`
or :data:`~kvlab.core.methods.PARAMS` plus its field; an axis of another kind is its field alone
(``tests/core/test_new_axis.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel

from kvlab.core.axis import Axis, bounds, field_axes, shape
from kvlab.core.kv_config import KVCacheConfig

#: How a leaf is entered: one of ``choices``, a whole number, a number, yes/no, text, or whole numbers.
LeafKind = Literal["choice", "int", "float", "bool", "text", "ints"]

AXES: tuple[Axis, ...] = field_axes(KVCacheConfig)
AXIS_BY_FIELD: dict[str, Axis] = {axis.field: axis for axis in AXES}


def nested_model(axis: Axis) -> type[BaseModel] | None:
    """The model of a nested table's value (a decode policy, a layer pattern), or None."""
    annotation = KVCacheConfig.model_fields[axis.field].annotation
    for arg in get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


@dataclass(frozen=True)
class Leaf:
    """One value a user types: a scalar field of the config, or a field of one of its nested tables.

    ``column``: its key in the configs table; ``flag``: its ``kvlab serve`` option (``--flag``), None when
    it is not one.  ``kind``, ``choices``, ``low`` / ``high`` (with ``low_open`` / ``high_open`` for strict
    bounds) and ``default`` are read from the pydantic field.
    """

    axis: Axis
    name: str  # the field in its model (the config's, or the nested table's)
    column: str
    flag: str | None
    title: str
    help: str
    kind: LeafKind
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    default: Any = None


_KINDS: dict[Any, LeafKind] = {bool: "bool", int: "int", float: "float"}


def _leaf(axis: Axis, model: type[BaseModel], name: str, column: str, flag: str | None,
          title: str, help_text: str) -> Leaf:
    info = model.model_fields[name]
    annotation, metadata = shape(info.annotation)
    metadata += list(info.metadata)
    kind: LeafKind
    choices: tuple[Any, ...] = ()
    if get_origin(annotation) is tuple:  # a list of whole numbers (layer indices), bounded item by item
        annotation, item_bounds = shape(get_args(annotation)[0])
        kind, metadata = "ints", metadata + item_bounds
    elif get_origin(annotation) is Literal:
        kind, choices = "choice", get_args(annotation)
    else:
        kind = _KINDS.get(annotation, "text")
    default = None if info.is_required() else info.default
    return Leaf(axis, name, column, flag, title, help_text, kind, choices, default=default, **bounds(metadata))


def leaves() -> tuple[Leaf, ...]:
    """Every value of a config a user types, in the table's order (a nested table's fields in its model's)."""
    out: list[Leaf] = []
    for axis in AXES:
        nested = nested_model(axis)
        if nested is None:
            out.append(_leaf(axis, KVCacheConfig, axis.field, axis.field, axis.field if axis.option else None,
                             axis.title, axis.help))
            continue
        for name in nested.model_fields:
            column = axis.column_prefix + name
            info = nested.model_fields[name]
            out.append(_leaf(axis, nested, name, column, axis.flag_prefix + name if axis.option else None,
                             info.title or name, info.description or ""))
    return tuple(out)


#: The leaves, computed once (the table is constant).
LEAVES: tuple[Leaf, ...] = leaves()
#: The configs table's columns, in the order shown.
CONFIG_COLUMNS: tuple[str, ...] = tuple(leaf.column for leaf in LEAVES if leaf.axis.column)
#: Their headings (a message about a cell names its row and its column's heading).
CONFIG_LABELS: dict[str, str] = {leaf.column: leaf.title for leaf in LEAVES}
#: The nested tables, by field: the prefix of their columns and their model.
NESTED_COLUMNS: dict[str, tuple[str, type[BaseModel]]] = {
    axis.field: (axis.column_prefix, nested) for axis in AXES if (nested := nested_model(axis)) is not None}


def applies(axis: Axis, config: KVCacheConfig) -> bool:
    """Whether ``axis`` means something in ``config`` (its value would change what is stored)."""
    if axis.applies == "setting":
        return config.quantizes and any(s.field == axis.field for s in config.settings)
    if axis.applies == "evicts":
        return config.evict != "none"
    if axis.applies == "given":
        return getattr(config, axis.field) is not None
    return True


def given_leaves(config: KVCacheConfig) -> list[tuple[Leaf, Any]]:
    """The options that reproduce ``config`` from the defaults: each leaf of an axis that applies, whose
    value is off its default or, for a format setting, shown in the config's label (``int4/g64``)."""
    out: list[tuple[Leaf, Any]] = []
    for leaf in LEAVES:
        if leaf.flag is None or not applies(leaf.axis, config):
            continue
        value = getattr(config, leaf.axis.field)
        if nested_model(leaf.axis) is not None:
            value = getattr(value, leaf.name)
        shown = leaf.axis.applies == "setting" and any(s.field == leaf.name and s.label(value) for s in config.settings)
        if value is not None and value != () and (value != leaf.default or shown):
            out.append((leaf, value))
    return out


def config_values(options: dict[str, Any]) -> dict[str, Any]:
    """``KVCacheConfig`` fields from option values by flag (None: not given), nested tables nested."""
    values: dict[str, Any] = {}
    for leaf in LEAVES:
        value = options.get(leaf.flag) if leaf.flag is not None else None
        if value is None or value == [] or value == ():
            continue
        if nested_model(leaf.axis) is None:
            values[leaf.axis.field] = value
        else:
            values.setdefault(leaf.axis.field, {})[leaf.name] = value
    return values
