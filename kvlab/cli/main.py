"""``kvlab`` command line: the same operations as the dashboard.

Exit statuses (0 success, 2 user error, 1 internal error, 130 Ctrl-C, 141 closed pipe) are
:mod:`kvlab.cli.exits`'s; every error is one line on stderr.  Each command's parser (and so each
command's imports) is its own module's: a command imports only its own (``kvlab ls`` no spec models,
server flags or tune), all of them are imported for ``kvlab --help`` or a command that does not exist.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from kvlab.cli import exits as cli_exit
from kvlab.secrets import install_log_redaction
from kvlab.threads import share_cores

#: Which module adds which commands' parsers (``module:function``, the order of ``kvlab --help``).
COMMAND_PARSERS: dict[str, tuple[str, ...]] = {
    "kvlab.cli.run:add_run_parser": ("run",),
    "kvlab.cli.catalog:add_catalog_parsers": ("models", "methods"),
    "kvlab.cli.tune:add_tune_parser": ("tune",),
    "kvlab.cli.serve:add_serve_parser": ("serve",),
    "kvlab.cli.doctor:add_doctor_parser": ("doctor",),
    "kvlab.cli.engines:add_engines_parser": ("engines",),
    "kvlab.cli.capacity:add_capacity_parser": ("capacity",),
    "kvlab.cli.store:add_store_commands": ("worker", "ls", "show", "notes", "compare", "cancel", "rerun", "export",
                                            "db"),
}


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (``error: kvlab ls: argument --limit: ...``), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(cli_exit.EXIT_USER, f"error: {self.prog}: {message} (see `{self.prog} --help`)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or only of the module that has ``command`` when it is one."""
    parser = Parser(prog="kvlab", description="KV-cache compression lab bench")
    sub = parser.add_subparsers(dest="command", required=True)
    owners = [target for target, commands in COMMAND_PARSERS.items() if command in commands] or list(COMMAND_PARSERS)
    for target in owners:
        module, function = target.split(":")
        getattr(importlib.import_module(module), function)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    share_cores()  # before any command imports torch
    argv = sys.argv[1:] if argv is None else argv
    install_log_redaction()  # no log line of any command shows a URL password or a key
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    return cli_exit.run(lambda: args.func(args), argv)


def entry() -> None:
    """The ``kvlab`` command: :func:`main`, then the process's end (see :func:`kvlab.cli.exits.exit_process`)."""
    cli_exit.exit_process(main())


if __name__ == "__main__":
    entry()
