"""How much work one spec may ask for, and how long its texts may be.

A valid-looking spec can name a million items or a ten-thousand-config sweep; every worker that
claims it then stalls (on a shared store, every host), and a tune space with a tiny budget step
used to hang validation itself.  Each count is bounded where a spec is parsed -- the CLI, the
dashboard and the worker that claims it -- by counting it arithmetically, never by building what is
counted, so validation stays fast whatever the numbers.

The work bounds are defaults that an environment variable raises on the host that parses the spec
(a worker honours its own host's bounds: one host's raised limit does not make every other host run
the spec), so every host of a shared store should set the same values.  The text bounds are fixed:
they keep names short enough for a table and free of terminal control sequences.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kvlab.core.errors import ConfigError


class FieldProblem(ValueError):
    """A problem a whole-spec check found in one field: ``path`` (``tasks.0.num_items``) is where
    :func:`kvlab.core.experiment_spec.format_validation_error` reports it, so that the dashboard puts it on that
    field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class Bound:
    """An upper bound on a count, ``default`` unless the environment variable ``variable`` says otherwise."""

    variable: str
    default: int
    unit: str  # what is counted, as the message says it: "configs per experiment"

    def limit(self) -> int:
        text = os.environ.get(self.variable, "").strip().replace("_", "").replace(",", "")
        if not text:
            return self.default
        if not text.isdigit() or int(text) < 1:
            raise ConfigError(f"{self.variable} must be a positive whole number, got "
                              f"{os.environ[self.variable]!r} (default {self.default:,})")
        return int(text)

    def check(self, path: str, count: int, what: str) -> None:
        """Raise :class:`FieldProblem` at ``path`` when ``count`` exceeds the limit; ``what`` says what
        was counted, with ``{n}`` for the count (``"the [sweep] grid expands to {n} configs"``)."""
        limit = self.limit()
        if count > limit:
            raise FieldProblem(path, f"{what.format(n=f'{count:,}')}; at most {limit:,} {self.unit} "
                                     f"(set {self.variable} to raise it)")


#: Every work bound, by name.
CONFIGS = Bound("KVLAB_MAX_CONFIGS", 512, "configs per experiment")
TASKS = Bound("KVLAB_MAX_TASKS", 256, "tasks per experiment")
ITEMS = Bound("KVLAB_MAX_ITEMS", 10_000, "items per context length of a generated task")
ITEM_EVALS = Bound("KVLAB_MAX_ITEM_EVALS", 100_000, "item evaluations (items x configs) per experiment")
TUNE_POINTS = Bound("KVLAB_MAX_TUNE_POINTS", 100_000, "points in a tune's search space")
BOUNDS: dict[str, Bound] = {"configs": CONFIGS, "tasks": TASKS, "items": ITEMS, "item_evals": ITEM_EVALS,
                            "tune_points": TUNE_POINTS}

#: Text fields: longest name (experiment, config), tag, tag count and notes (which may hold lines and tabs).
#: Most configs one playground run compares beside the baseline (``kvlab serve``'s /kvlab/playground and its page).
PLAYGROUND_CONFIGS = 8
#: Most new tokens a playground answer may take (the server's bound, the page's Max new tokens).
PLAYGROUND_NEW_TOKENS = 256
MAX_NAME_CHARS = 200
MAX_TAG_CHARS = 64
MAX_TAGS = 32
MAX_NOTES_CHARS = 10_000


def check_text(value: str, limit: int = MAX_NAME_CHARS, allowed: str = "") -> str:
    """``value`` if it is at most ``limit`` characters, each printable or in ``allowed`` (names allow
    none: no newline, tab, escape or other control or format character, since names are printed in
    tables, terminals and figures).  The message follows the field's path."""
    if len(value) > limit:
        raise ValueError(f"{len(value):,} characters; at most {limit:,}")
    bad = next((i for i, c in enumerate(value) if not c.isprintable() and c not in allowed), None)
    if bad is not None:
        kinds = "printable characters" + (", newlines and tabs" if allowed else " only (no newline, tab or escape)")
        raise ValueError(f"holds the control character {value[bad]!r} at position {bad}; use {kinds}")
    return value
