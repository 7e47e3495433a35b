"""The table of config axes: every field of :class:`~kvlab.core.kv_config.KVCacheConfig`, once, with what
each consumer needs to know of it.

An :class:`Axis` is one config field: its heading and help, the ``[sweep]`` and ``[tune]`` keys that list
it, whether the configs table shows it as a column and whether ``kvlab serve`` takes it as an option, and
*when it applies* (a setting only to the formats that read it, a budget only with a method).  Its type,
allowed values, bounds and default are the field's own (``KVCacheConfig.model_fields``): the entity
declares them once, typed, and :func:`leaves` reads them from there.  A nested table (a decode policy,
the 16-bit layers) is one axis whose fields are flattened into one :class:`Leaf` each.

What is derived from this table: ``kvlab serve``'s KV options and their inverse (the recommendation's
``serve_command``), the configs table's columns, headings, widgets and the coercion of its cells (the
form and the playground), and the check that every ``KVCacheConfig`` field has its entry
(``tests/core/test_axes.py``).  The registries the entries come from stay the one place of their
vocabularies: a new format setting, budget kind or method parameter is one entry of
:data:`~kvlab.core.formats.SETTINGS`, :data:`~kvlab.core.methods.BUDGETS` or
:data:`~kvlab.core.methods.PARAMS` (plus its ``KVCacheConfig`` field); a new axis of another kind is one
entry here plus its field.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel

from kvlab.core.formats import SETTINGS
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.methods import BUDGETS, PARAMS

#: When an axis's value means something: ``always``; ``setting``
#: (a format of the config reads it: the format registry's ``settings``); ``evicts`` (a config with an
#: eviction method); ``given`` (a nested table that is set).
Applies = Literal["always", "setting", "evicts", "given"]
#: How a leaf is entered: one of ``choices``, a whole number, a number, yes/no, text, or whole numbers.
LeafKind = Literal["choice", "int", "float", "bool", "text", "ints"]


@dataclass(frozen=True)
class Axis:
    """One ``KVCacheConfig`` field, as the sweep, the tune, the form and ``kvlab serve`` see it.

    ``sweep`` / ``tune``: the key of the ``[sweep]`` / ``[tune]`` table that lists its values (None: that
    table does not vary it).  ``column``: shown in the configs table (the others ride along unchanged).
    ``option``: a ``kvlab serve`` option (a nested table's fields become ``--<flag_prefix><field>``).
    ``column_prefix`` / ``flag_prefix``: how a nested table's fields are named as columns and options.
    """

    field: str
    title: str
    help: str
    applies: Applies = "always"
    sweep: str | None = None
    tune: str | None = None
    column: bool = True
    option: bool = True
    column_prefix: str = ""
    flag_prefix: str = ""
    grid_title: str = ""  # the heading of the sweep's and the tune's widget that lists its values

    @property
    def grid_heading(self) -> str:
        return self.grid_title or self.title

    @property
    def nested(self) -> type[BaseModel] | None:
        """The model of a nested table's value (a decode policy, a layer pattern), or None."""
        for arg in get_args(KVCacheConfig.model_fields[self.field].annotation) or (
                KVCacheConfig.model_fields[self.field].annotation,):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
        return None


_FORMAT_HELP = "the keys' and values' format (the keys' alone when value quant is set)"
AXES: tuple[Axis, ...] = (
    Axis("name", "name", "optional; derived from the settings if blank", option=False),
    Axis("quant", "quant", _FORMAT_HELP, sweep="quant", tune="quant", grid_title="Quantization formats"),
    Axis("value_quant", "value quant (if not quant)",
         "store values in another format than keys, e.g. keys int8 and values int4 (KIVI: keys need more care); "
         "blank: as quant", sweep="value_quant", tune="value_quant", grid_title="Value formats (also)"),
    *(Axis(s.field, s.title, s.help, applies="setting", sweep=s.sweep_key, tune=s.tune_key, column=s.column,
           grid_title=s.title.capitalize()) for s in SETTINGS.values()),
    Axis("skip_layers", "16-bit layers", "layers whose cache stays 16-bit under the quantization (vLLM's "
         "--kv-cache-dtype-skip-layers)", applies="given", sweep="skip_layers", tune="skip_layers",
         column_prefix="skipped_", flag_prefix="skip_", grid_title="16-bit layer patterns"),
    Axis("rotation", "rotation", "a Hadamard rotation of quantized keys and values: true rotates kvlab's own "
         "formats, false turns a serving engine's off (llama.cpp's attn_rot); blank: the engine's default",
         applies="given", sweep="rotation", tune="rotation", grid_title="Rotation settings (also)"),
    Axis("evict", "evict", "the eviction method; the budgets each accepts: `kvlab methods`", sweep="evict",
         tune="evict", grid_title="Eviction methods"),
    *(Axis(b.name, b.title, b.help, applies="evicts", sweep="ratios" if b.name == "ratio" else None,
           grid_title="Ratios (fraction removed)") for b in BUDGETS.values()),
    Axis("query_aware", "query-aware", "the question is in the scorer's window (SnapKV's paper); the server "
         "sets it itself", applies="evicts", sweep="query_aware", tune="query_aware", option=False,
         grid_title="Query-aware eviction"),
    *(Axis(name, name.replace("_", " "), p.help, applies="evicts", column=False) for name, p in PARAMS.items()),
    Axis("heads", "heads (budget shared by)", "share each layer's budget out across its KV heads (adakv, "
         "critical_adakv; default uniform)", applies="evicts", sweep="heads", tune="heads", grid_title="Head budgets"),
    Axis("alpha_safeguard", "head safeguard", "with a head-wise budget: the least share of an equal split each "
         "head keeps (kvpress's alpha_safeguard)", applies="evicts"),
    Axis("decode", "decode", "compress during generation too (kvpress's DecodingPress)", applies="given",
         sweep="decode", tune="decode", column_prefix="decode_", flag_prefix="decode_", grid_title="Decode policies"),
)
AXIS_BY_FIELD: dict[str, Axis] = {axis.field: axis for axis in AXES}

#: The headings and help of a nested table's fields (the model's own descriptions where it has them).
NESTED_TEXT: dict[str, tuple[str, str]] = {
    "decode_interval": ("decode: every (passes)", "compress the cache during generation every N passes, scored "
                        "by the evict method; with it, the prompt budget is optional"),
    "decode_target_tokens": ("decode: to (tokens)", "... back to this many tokens (or give a ratio)"),
    "decode_ratio": ("decode: ratio (removed)", "... or removing this fraction of all tokens seen so far"),
    "decode_buffer": ("decode: buffer (passes)", "hidden states of recent passes the scorer reads (default 256)"),
    "skipped_first": ("16-bit: first (layers)", "keep the first N layers 16-bit"),
    "skipped_last": ("16-bit: last (layers)", "keep the last N layers 16-bit"),
    "skipped_layers": ("16-bit: layers (indices)", "keep these layers 16-bit (vLLM's --kv-cache-dtype-skip-layers), "
                       "e.g. 0, 5"),
}


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


def shape(annotation: Any) -> tuple[Any, list[Any]]:
    """A field's annotation without ``None`` and ``Annotated``: the bare type and the bounds metadata."""
    metadata: list[Any] = []
    while True:
        if get_origin(annotation) is Annotated:
            base, *extra = get_args(annotation)
            metadata += [m for item in extra for m in getattr(item, "metadata", [item])]
            annotation = base
        elif get_origin(annotation) in (typing.Union, types.UnionType):
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation, metadata


_KINDS: dict[Any, LeafKind] = {bool: "bool", int: "int", float: "float"}


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    """``low``/``high`` (and whether each is strict) from pydantic's bounds metadata (``Ge``, ``Gt``, ...)."""
    bounds: dict[str, Any] = {}
    for item in metadata:
        for name, key, strict in (("ge", "low", False), ("gt", "low", True), ("le", "high", False),
                                  ("lt", "high", True)):
            if getattr(item, name, None) is not None:
                bounds |= {key: getattr(item, name), f"{key}_open": strict}
    return bounds


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
    return Leaf(axis, name, column, flag, title, help_text, kind, choices, default=default, **_bounds(metadata))


def leaves() -> tuple[Leaf, ...]:
    """Every value of a config a user types, in the table's order (a nested table's fields in its model's)."""
    out: list[Leaf] = []
    for axis in AXES:
        nested = axis.nested
        if nested is None:
            out.append(_leaf(axis, KVCacheConfig, axis.field, axis.field, axis.field if axis.option else None,
                             axis.title, axis.help))
            continue
        for name in nested.model_fields:
            column = axis.column_prefix + name
            title, help_text = NESTED_TEXT[column]
            out.append(_leaf(axis, nested, name, column, axis.flag_prefix + name if axis.option else None,
                             title, help_text))
    return tuple(out)


#: The leaves, computed once (the table is constant).
LEAVES: tuple[Leaf, ...] = leaves()
#: The configs table's columns, in the order shown.
CONFIG_COLUMNS: tuple[str, ...] = tuple(leaf.column for leaf in LEAVES if leaf.axis.column)
#: Their headings (a message about a cell names its row and its column's heading).
CONFIG_LABELS: dict[str, str] = {leaf.column: leaf.title for leaf in LEAVES}
#: The nested tables, by field: the prefix of their columns and their model.
NESTED_COLUMNS: dict[str, tuple[str, type[BaseModel]]] = {
    axis.field: (axis.column_prefix, nested) for axis in AXES if (nested := axis.nested) is not None}


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
        if leaf.axis.nested is not None:
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
        if leaf.axis.nested is None:
            values[leaf.axis.field] = value
        else:
            values.setdefault(leaf.axis.field, {})[leaf.name] = value
    return values
