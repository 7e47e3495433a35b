"""``python -m kvlab.reference``: write the generated reference pages under ``docs/reference/``;
``--check``: write nothing, list the pages that differ from what the code generates (exit 1)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from kvlab.paths import REPO_ROOT

REFERENCE_DIR = REPO_ROOT / "docs" / "reference"


def _cli() -> str:
    from kvlab.cli.main import build_parser
    from kvlab.reference.cli import cli_page

    return cli_page(build_parser())


def _spec() -> str:
    from kvlab.reference.spec import spec_page

    return spec_page()


def _registries() -> str:
    from kvlab.reference.registries import registries_page

    return registries_page()


def _http() -> str:
    from kvlab.reference.http_api import http_page, routes

    return http_page(routes())


def _capacity() -> str:
    from kvlab.reference.capacity import capacity_page

    return capacity_page()


def _layout() -> str:
    from kvlab.reference.layout import layout_page

    return layout_page()


#: Each generated page and what makes it.
PAGES: dict[str, Callable[[], str]] = {"cli.md": _cli, "spec.md": _spec, "registries.md": _registries,
                                        "http-api.md": _http, "capacity.md": _capacity, "layout.md": _layout}


def stale_pages(directory: Path = REFERENCE_DIR) -> list[str]:
    """The generated pages under ``directory`` that differ from what the code generates now (or are missing)."""
    return [name for name, make in PAGES.items()
            if not (directory / name).is_file() or (directory / name).read_text(encoding="utf-8") != make()]


def write_pages(directory: Path = REFERENCE_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, make in PAGES.items():
        (directory / name).write_text(make(), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlab.reference", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, write nothing; exit 1 if a page differs")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for name in stale:
            print(f"docs/reference/{name} differs from the code: run `python -m kvlab.reference`", file=sys.stderr)
        return 1 if stale else 0
    write_pages()
    return 0


if __name__ == "__main__":
    sys.exit(main())
