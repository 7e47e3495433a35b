"""``python -m kvlab.cli``."""

from kvlab.cli.main import entry

entry()
