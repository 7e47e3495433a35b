"""The documentation site's reference, generated from the code so that it cannot drift from it.

Each page of ``docs/reference/`` is one function's output: the CLI from the argument parsers
(:mod:`.cli`), the spec schema from the pydantic models (:mod:`.schema`), the registries' tables
(:mod:`.registries`) and ``kvlab serve``'s HTTP API from its app (:mod:`.http_api`).  A field without a
description or an argument without help is an error (:class:`MissingText`), never an empty cell.
``python -m kvlab.reference`` writes the pages; ``--check`` says which differ from the code
(``tests/docs/test_reference.py`` runs it).
"""

from __future__ import annotations

import itertools
import re

#: Sphinx roles of docstrings (``:class:`~kvlab.core.X` ``) and their target's last name.
_ROLE = re.compile(r":[a-z]+:`~?\.?(?:[\w.]+\.)?(\w+)`")


class MissingText(ValueError):
    """Something the reference documents says nothing about itself: each entry names one."""

    def __init__(self, what: str, missing: list[str]) -> None:
        self.missing = missing
        super().__init__(f"{len(missing)} {what}: {', '.join(missing)}")


def cell(text: str) -> str:
    """``text`` (a docstring's too) as one Markdown table cell: on one line, its pipes escaped, Sphinx roles as code."""
    parts = _ROLE.sub(r"`\1`", " ".join(text.split())).replace("|", "\\|").split("`")
    # outside code spans, an angle bracket would open an HTML tag
    return "`".join(part if inside else part.replace("<", "&lt;").replace(">", "&gt;")
                    for inside, part in zip(itertools.cycle((False, True)), parts, strict=False))
