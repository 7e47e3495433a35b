"""The code's layout as a page: every package and module of ``kvlab/``, ``pages/`` and ``app.py`` with the first
paragraph of its own docstring, so that the map cannot drift from the code (``docs/reference/layout.md``)."""

from __future__ import annotations

import ast
from pathlib import Path

from kvlab.paths import REPO_ROOT
from kvlab.reference import MissingText, cell


def _summary(path: Path) -> str:
    """The first paragraph of the module's docstring, "" where it has none (:func:`layout_page` refuses that)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), str(path))) or ""
    return doc.split("\n\n")[0].strip()


def _undescribed(root: Path) -> list[str]:
    paths = [*(root / "kvlab").rglob("*.py"), *(root / "pages").glob("*.py"), root / "app.py"]
    return sorted(str(path.relative_to(root)) for path in paths
                  if path.name != "__init__.py" and not _summary(path))


def _modules(folder: Path) -> list[Path]:
    """The folder's own modules (its ``__init__`` is the package's heading, not a row)."""
    return sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")


def _section(folder: Path, title: str) -> list[str]:
    lines = [f"## `{title}`", ""]
    init = folder / "__init__.py"
    if init.is_file() and (about := _summary(init)):
        lines += [cell(about), ""]
    rows = [f"| `{path.name}` | {cell(_summary(path))} |" for path in _modules(folder)]
    return [*lines, "| module | what it is |", "|---|---|", *rows, ""] if rows else lines


def layout_page(root: Path = REPO_ROOT) -> str:
    """The page; :class:`~kvlab.reference.MissingText` where a module says nothing of itself."""
    if missing := _undescribed(root):
        raise MissingText("modules without a docstring", missing)
    package = root / "kvlab"
    folders = sorted({path.parent for path in package.rglob("*.py")} - {package})
    lines = ["# Code layout", "",
             "Generated from each module's docstring (`python -m kvlab.reference`). Tests mirror the code: "
             "`kvlab/<pkg>/` is tested in `tests/<pkg>/` (the dashboard with `pages/` and `app.py` in "
             "`tests/dashboard/`), `kvlab/<module>.py` in `tests/test_<module>.py`; `tests/adversarial/` (bad "
             "inputs), `tests/e2e/` (Chromium) and the top-level helpers span packages. `kvlab/core/` is the bottom "
             "layer: every other package imports it and it imports none of them (`tests/test_no_import_cycle.py`).",
             "", *_section(package, "kvlab/")]
    for folder in folders:
        lines += _section(folder, f"{folder.relative_to(root)}/")
    lines += ["## The dashboard: `app.py` and `pages/`", "", "| module | what it is |", "|---|---|",
              f"| `app.py` | {cell(_summary(root / 'app.py'))} |",
              *(f"| `pages/{path.name}` | {cell(_summary(path))} |" for path in _modules(root / "pages")), ""]
    return "\n".join(lines)
