"""Errors the store raises.  Each message says what is wrong and, where there is one, the fix."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The database cannot be used as asked (unreachable, corrupt, read-only, bad request...)."""


class StoreReadOnlyError(StoreError):
    """A write was refused: the database is read-only (file permissions, ``mode=ro`` / ``immutable``)."""


class StoreLost(StoreError):
    """The SQLite file this process opened was deleted, replaced or made read-only under it: nothing
    it writes from now on would be kept, so a worker stops (``kvlab worker`` and ``kvlab run`` exit 1)."""


class SchemaOutdatedError(StoreError):
    """The database has no kvlab schema, or an older one: `kvlab db upgrade` fixes it."""


class ExperimentNotFoundError(StoreError, LookupError):
    """No experiment with that id."""


class TrialNotFoundError(StoreError, LookupError):
    """No trial with that id."""
