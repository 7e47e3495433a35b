"""The ``kvlab`` command line: one module per command group, the exit policy and option types."""

from kvlab.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
