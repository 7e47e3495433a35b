"""The spec schema as Markdown tables, read from the pydantic models: every field's type, default, bounds and
description (a field without one raises :class:`~kvlab.reference.MissingText`)."""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Literal, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from kvlab.reference import MissingText, cell

_BOUNDS: tuple[tuple[type, str, str], ...] = (
    (at.Ge, "ge", "≥"), (at.Gt, "gt", ">"), (at.Le, "le", "≤"), (at.Lt, "lt", "<"),
    (at.MinLen, "min_length", "items ≥"), (at.MaxLen, "max_length", "items ≤"), (at.MultipleOf, "multiple_of", "× of"),
)


def anchor(model: type[BaseModel]) -> str:
    """The heading anchor of ``model``'s table."""
    return model.__name__.lower()


def type_name(annotation: Any) -> str:
    """A field type as a reader writes it in TOML terms: ``"a" | "b"``, ``list of int``, a model as a link."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        return " \\| ".join(f'`"{a}"`' if isinstance(a, str) else f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        named = [type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(named)
    if origin in (list, tuple, Sequence) or annotation in (list, tuple):
        items = [a for a in args if a is not Ellipsis]
        if origin is tuple and len(items) > 1 and Ellipsis not in args:
            return f"[{', '.join(type_name(a) for a in items)}]"
        return f"list of {type_name(items[0])}" if items else "list"
    if origin is dict:
        return "table"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{anchor(annotation)})"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(annotation, str(annotation))


def _constraints(metadata: Sequence[Any]) -> list[str]:
    found = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            found += _constraints(item.metadata)
        for kind, attribute, sign in _BOUNDS:
            if isinstance(item, kind):
                found.append(f"{sign} {getattr(item, attribute)}")
    return found


def bounds(field: FieldInfo) -> str:
    """The field's bounds, and its items' (``each ≥ 0``), from its metadata and any ``Annotated`` inside it."""
    own = _constraints(field.metadata)
    annotation = field.annotation
    for arg in get_args(annotation) if get_origin(annotation) in (typing.Union, types.UnionType) else (annotation,):
        if get_origin(arg) is Annotated:
            own += _constraints(get_args(arg)[1:])
        elif get_origin(arg) in (list, tuple):
            own += [f"each {c}" for inner in get_args(arg) if get_origin(inner) is Annotated
                    for c in _constraints(get_args(inner)[1:])]
    return ", ".join(own)


def default(field: FieldInfo) -> str:
    """The default as TOML would write it; ``required`` when there is none, ``unset`` for None."""
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "its defaults"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, list | tuple):
        return "`[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value) + "]`"
    return f"`{value}`"


def model_table(model: type[BaseModel], skip: Sequence[str] = ()) -> str:
    """One model's fields as a table (``skip``: fields a spec file does not write as keys)."""
    fields = {name: f for name, f in model.model_fields.items() if name not in skip}
    missing = [f"{model.__name__}.{name}" for name, f in fields.items() if not (f.description or "").strip()]
    if missing:
        raise MissingText("spec fields without a description (give each a pydantic Field(description=...))", missing)
    rows = ["| field | type | default | bounds | description |", "|---|---|---|---|---|"]
    rows += [f"| `{name}` | {type_name(f.annotation)} | {default(f)} | {bounds(f)} | {cell(f.description or '')} |"
             for name, f in fields.items()]
    return "\n".join(rows)


def model_section(model: type[BaseModel], title: str, skip: Sequence[str] = (), level: int = 2) -> str:
    """A heading (anchored by the model's name), the model's docstring's first paragraph, then its table."""
    doc = (model.__doc__ or "").strip().split("\n\n")[0]
    intro = f"{cell(doc)}\n\n" if doc else ""
    return f"{'#' * level} {title} {{#{anchor(model)}}}\n\n{intro}{model_table(model, skip)}\n"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def nested_models(model: type[BaseModel]) -> list[type[BaseModel]]:
    """``model``, then every model its fields hold (through lists, unions and ``Annotated``), each once."""
    found = [model]
    for field in model.model_fields.values():
        for inner in _models_in(field.annotation):
            found += [m for m in nested_models(inner) if m not in found]
    return found
