"""One config axis, declared once: an :class:`Axis` rides on its :class:`~kvlab.core.kv_config.KVCacheConfig`
field as ``Annotated`` metadata, beside the field's own type, bounds, default and description.

Everything else about the axis is derived from that one declaration: the axes table
(:mod:`kvlab.core.axes`: ``kvlab serve``'s options, the recommendation's command, the configs table's
columns), the ``[sweep]`` and ``[tune]`` fields of an axis each quantizing config is *also* run with
(:attr:`Axis.also`) and of a format setting (:func:`grid_fields`), the config space's walk and its Optuna
parameters (:class:`~kvlab.core.space.ConfigSpace`), a config's label and the check that such an axis is
given only with a quantization.  ``tests/core/test_new_axis.py`` adds an axis as one field and sees it in
every face.

Pure: imports pydantic and nothing of kvlab's.
"""

from __future__ import annotations

import functools
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

#: When an axis's value means something: ``always``; ``setting``
#: (a format of the config reads it: the format registry's ``settings``); ``evicts`` (a config with an
#: eviction method); ``given`` (a nested table or an optional value that is set).
Applies = Literal["always", "setting", "evicts", "given"]
#: A grid table: the sweep lists one value of a format setting, the tune a list of them.
GridTable = Literal["sweep", "tune"]


@dataclass(frozen=True)
class Axis:
    """How the sweep, the tune, the form and ``kvlab serve`` see one ``KVCacheConfig`` field.

    ``sweep`` / ``tune``: the key of the ``[sweep]`` / ``[tune]`` table that lists its values (None: that
    table does not vary it).  ``column``: shown in the configs table (the others ride along unchanged).
    ``option``: a ``kvlab serve`` option (a nested table's fields become ``--<flag_prefix><field>``).
    ``column_prefix`` / ``flag_prefix``: how a nested table's fields are named as columns and options.
    ``form_help``: the longer help the form's widgets show (blank: ``help``).

    ``also``: each config of a grid that quantizes is also run with each value its ``[sweep]`` / ``[tune]``
    list holds (besides the default, unset), the list's field and the config space's walk derived from here;
    a config that sets it must quantize.  ``label``: the part of a config's label that says its value (an
    ``also`` axis; blank function: ``/<field>=<value>``).  ``field`` is bound from the field's name.
    """

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
    grid_help: str = ""  # what the [sweep] / [tune] list of its values means (an `also` axis's field description)
    form_help: str = ""
    also: bool = False
    label: Callable[[Any], str] | None = None
    field: str = ""

    @property
    def grid_heading(self) -> str:
        return self.grid_title or self.title.capitalize()

    def value_label(self, value: Any) -> str:
        """The part of a config's label that says ``value``."""
        return self.label(value) if self.label is not None else f"/{self.field}={json.dumps(plain(value))}"


def also_axis(field: str, title: str, help: str, grid_help: str, *, label: Callable[[Any], str] | None = None,
              **more: Any) -> Axis:
    """An axis each quantizing config of a grid is also run with: listed under ``field`` in ``[sweep]`` and
    ``[tune]``, applying when given."""
    return Axis(title, help, applies="given", sweep=field, tune=field, grid_help=grid_help, also=True, label=label,
                **more)


def plain(value: Any) -> Any:
    """A value as a config point and a choice key hold it: a nested table as its fields set."""
    return value.model_dump(mode="json", exclude_defaults=True) if isinstance(value, BaseModel) else value


def choice_key(value: Any) -> str:
    """A value of an axis as an Optuna categorical value: ``"none"`` for unset, else its JSON with sorted keys
    (a nested table's fields, ``true`` / ``false``); stored studies depend on these strings."""
    return "none" if value is None else json.dumps(plain(value), sort_keys=True)


@functools.cache
def field_axes(model: type[BaseModel]) -> tuple[Axis, ...]:
    """The axis of every field of ``model``, in the fields' order, each bound to its field's name; a field
    without one is a TypeError (so a new field cannot miss its declaration)."""
    axes = []
    for name, info in model.model_fields.items():
        found = [m for m in info.metadata if isinstance(m, Axis)]
        if len(found) != 1:
            raise TypeError(f"{model.__name__}.{name} needs one Axis in its Annotated metadata (kvlab.core.axis)")
        axes.append(replace(found[0], field=name))
    return tuple(axes)


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


def bounds(metadata: list[Any]) -> dict[str, Any]:
    """``low``/``high`` (and whether each is strict: ``low_open``/``high_open``) from pydantic's bounds metadata
    (``Ge``, ``Gt``, ...)."""
    found: dict[str, Any] = {}
    for item in metadata:
        for name, key, strict in (("ge", "low", False), ("gt", "low", True), ("le", "high", False),
                                  ("lt", "high", True)):
            if getattr(item, name, None) is not None:
                found |= {key: getattr(item, name), f"{key}_open": strict}
    return found


def _value_type(info: FieldInfo) -> Any:
    """A field's value type with its bounds, without ``None`` and without its axis."""
    annotation, metadata = shape(info.annotation)
    bounds = [m for m in (*metadata, *info.metadata) if not isinstance(m, Axis)]
    return typing.cast(Any, Annotated)[(annotation, *bounds)] if bounds else annotation


def _list_of(item: Any) -> Any:
    """``list[item]`` for an item type made at run time."""
    return typing.cast(Any, list)[item]


def grid_fields(model: type[BaseModel], table: GridTable | None) -> dict[str, Any]:
    """``create_model`` fields of a grid derived from ``model``'s axes: with ``table`` None, a list per ``also``
    axis (empty: the default alone); with ``sweep``, one value per format setting it lists (the field's own
    default); with ``tune``, a list of them (the default alone unless given)."""
    fields: dict[str, Any] = {}
    for axis in field_axes(model):
        info = model.model_fields[axis.field]
        if table is None and axis.also:
            fields[axis.field] = (_list_of(_value_type(info)), Field(default_factory=list, description=axis.grid_help))
        elif table is not None and axis.applies == "setting" and (key := getattr(axis, table)) is not None:
            if table == "sweep":
                fields[key] = (_value_type(info), Field(default=info.default, description=axis.help))
            else:
                fields[key] = (_list_of(_value_type(info)), Field(
                    default_factory=lambda default=info.default: [default], min_length=1,
                    description=f"Values of {axis.title} the search may pick for the formats that read "
                                f"it: {axis.help}."))
    return fields
