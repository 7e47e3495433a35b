"""``kvlab serve``'s HTTP API as Markdown, read from its FastAPI app: each route with its method, whether it
needs the API key and its docstring, then the fields of each request body (a route without a docstring or a
field without a description raises :class:`~kvlab.reference.MissingText`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from fastapi.routing import APIRoute
from pydantic import BaseModel

from kvlab.reference import MissingText, cell
from kvlab.reference.schema import model_section, nested_models

INTRO = """# HTTP API of `kvlab serve`

Generated from the app of `kvlab serve` (`python -m kvlab.reference`). `kvlab serve` is the embedded engine
behind an OpenAI-compatible API on 127.0.0.1 (`kvlab serve --help`, [CLI reference](cli.md#kvlab-serve)). With
`--api-key-env VAR` set, the routes marked *key* need the header `Authorization: Bearer <key>`; without a key
the server answers only requests addressed to its own host names. Every error is OpenAI-shaped JSON
(`{"error": {"message", "type", "param", "code"}}`) with its status; unknown request fields are ignored, as
vLLM does, except sampling fields that kvlab cannot honour, which get a 400 naming them.
"""


def routes() -> list[APIRoute]:
    """The app's routes.  The app is built over no model (its routes do not read it until a request comes)."""
    from kvlab.serve.app import create_app
    from kvlab.serve.generation import ServedModel

    app = create_app(cast(ServedModel, SimpleNamespace(metrics=None)))
    return [route for route in app.routes if isinstance(route, APIRoute)]


def _body(route: APIRoute) -> type[BaseModel] | None:
    annotation: Any = route.body_field.field_info.annotation if route.body_field is not None else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def http_page(api_routes: list[APIRoute]) -> str:
    """The HTTP API page of ``api_routes``."""
    missing = [route.path for route in api_routes if not (route.endpoint.__doc__ or "").strip()]
    if missing:
        raise MissingText("routes without a docstring", missing)
    lines = [INTRO, "## Routes", "", "| method | path | auth | what it answers |", "|---|---|---|---|"]
    for route in api_routes:
        body = _body(route)
        what = cell(route.endpoint.__doc__ or "") + (f" Body: [{body.__name__}](#{body.__name__.lower()})."
                                                      if body else "")
        lines.append(f"| {', '.join(sorted(route.methods or ()))} | `{route.path}` | "
                     f"{'key' if route.dependencies else 'open'} | {what} |")
    lines += ["", "## Request bodies", ""]
    seen: list[type[BaseModel]] = []
    for route in api_routes:
        body = _body(route)
        for model in nested_models(body) if body else ():
            if model not in seen:
                seen.append(model)
                lines.append(model_section(model, f"`{model.__name__}`", level=3))
    return "\n".join(lines).rstrip() + "\n"
