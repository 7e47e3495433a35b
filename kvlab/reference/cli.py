"""Every ``kvlab`` command and argument as Markdown, read from the argument parsers (an argument or a command
without help raises :class:`~kvlab.reference.MissingText`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager

from kvlab.reference import MissingText, cell

#: Usage lines are wrapped at this width whatever the terminal's, so that the page is the same everywhere.
USAGE_COLUMNS = "100"


@contextmanager
def _fixed_width() -> Iterator[None]:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = USAGE_COLUMNS
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str | None, argparse.ArgumentParser]]:
    """``(name, help, parser)`` of each subcommand of ``parser``, in the order ``--help`` lists them."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            found += [(name, helps.get(name), sub) for name, sub in action.choices.items()]
    return found


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments a reader types: help actions, hidden ones and subcommand slots left out."""
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
            and a.help != argparse.SUPPRESS]


def _default(action: argparse.Action) -> str:
    if action.default in (None, False, argparse.SUPPRESS) or action.option_strings == [] or action.default == []:
        return ""
    return f"`{action.default}`"


def _name(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    takes = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
    return ", ".join(f"`{option}{takes}`" for option in action.option_strings)


def missing_help(parser: argparse.ArgumentParser, path: str = "kvlab") -> list[str]:
    """Every command and argument under ``parser`` that has no help, by its command line."""
    missing = [f"{path} {_name(a).strip('`')}" for a in _arguments(parser) if not (a.help or "").strip()]
    for name, help_text, sub in _subcommands(parser):
        if not (help_text or "").strip():
            missing.append(f"{path} {name}")
        missing += missing_help(sub, f"{path} {name}")
    return missing


def _command(name: str, help_text: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    formatter = parser._get_formatter()
    lines = [f"{'#' * level} `{parser.prog}`", "", cell(help_text), "", "```", parser.format_usage().strip(), "```", ""]
    arguments = _arguments(parser)
    if arguments:
        lines += ["| argument | choices | default | help |", "|---|---|---|---|"]
        lines += [f"| {_name(a)} | {', '.join(f'`{c}`' for c in a.choices or ())} | {_default(a)} | "
                  f"{cell(formatter._expand_help(a))} |" for a in arguments]
        lines.append("")
    for sub_name, sub_help, sub in _subcommands(parser):
        lines += _command(sub_name, sub_help or "", sub, level + 1)
    return lines


def cli_page(parser: argparse.ArgumentParser) -> str:
    """The CLI reference page of ``parser`` (``kvlab``'s whole parser)."""
    missing = missing_help(parser)
    if missing:
        raise MissingText("CLI commands or arguments without help (give each add_argument a help=...)", missing)
    with _fixed_width():
        lines = ["# CLI reference", "", "Generated from kvlab's argument parsers (`python -m kvlab.reference`). "
                 "Exit statuses: 0 success, 2 a user error (one line naming what to fix), 1 an internal error "
                 "(one line naming the log), 130 Ctrl-C, 141 the reader of stdout went away.", ""]
        for name, help_text, sub in _subcommands(parser):
            lines += _command(name, help_text or "", sub, 2)
    return "\n".join(lines).rstrip() + "\n"
