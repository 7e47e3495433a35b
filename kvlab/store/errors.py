"""Errors the store raises.  Each message says what is wrong and, where there is one, the fix."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The database cannot be used as asked (unreachable, corrupt, read-only, bad request...)."""


class SchemaOutdatedError(StoreError):
    """The database has no kvlab schema, or an older one: `kvlab db upgrade` fixes it."""


class ExperimentNotFoundError(StoreError, LookupError):
    """No experiment with that id."""


class TrialNotFoundError(StoreError, LookupError):
    """No trial with that id."""
