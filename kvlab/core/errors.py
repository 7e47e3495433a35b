"""The errors of a spec that cannot run, raised wherever it is checked (validation, this host, a worker)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A spec that cannot run, with a message that names the field and the allowed values."""


class HostLacksError(ConfigError):
    """This host lacks what the spec needs (a package, an interpreter, a model, a key, a task
    file); another host may have it, so a worker gives the trials back instead of failing them."""
