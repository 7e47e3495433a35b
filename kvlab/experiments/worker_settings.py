"""The options of ``kvlab worker``, checked before the worker connects or claims anything.

A light module (no torch) so that ``kvlab worker --telemetry-hz 1000`` answers at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from kvlab.core.errors import ConfigError
from kvlab.experiments.telemetry import MAX_HZ, MIN_HZ

#: Inclusive bounds of the numeric settings (the flag is the field with ``-`` for ``_``).  A
#: heartbeat or poll under 50 ms would hammer a shared database; the upper bounds catch typos.
#: ``stale_after_s`` is bounded below by twice the heartbeat instead.
_BOUNDS: dict[str, tuple[float, float, str]] = {
    "max_trials": (1, 1000, "trials"),
    "heartbeat_s": (0.05, 3600, "seconds"),
    "poll_s": (0.05, 3600, "seconds"),
    "telemetry_hz": (MIN_HZ, MAX_HZ, "samples per second"),
    "threads": (1, 4096, "threads"),
    "backoff_s": (0, 7 * 86400, "seconds"),
    "max_failures": (1, 1000, "failures in a row"),
}
MAX_STALE_S = 7 * 86400
_WHOLE = ("max_trials", "threads", "max_failures")


@dataclass(frozen=True)
class WorkerSettings:
    """The options of ``kvlab worker`` (each field is its flag); checked when made: a bad one
    raises :class:`ConfigError` naming the flag and what is allowed."""

    max_trials: int = 4
    heartbeat_s: float = 5.0
    stale_after_s: float = 60.0
    on_stale: str = "requeue"  # or "fail"
    poll_s: float = 2.0
    telemetry_hz: float = 1.0
    threads: int | None = None  # torch CPU threads; None: the cores this process may use (kvlab.threads)
    backoff_s: float = 600.0  # how long this worker leaves an experiment it could not run to others
    max_failures: int = 3  # worker-side failures in a row before the worker stops
    exit_when_idle: bool = False

    def __post_init__(self) -> None:
        for name, (low, high, unit) in _BOUNDS.items():
            if not (name == "threads" and self.threads is None):
                _check(name, getattr(self, name), low, high, unit)
        if self.on_stale not in ("requeue", "fail"):
            raise ConfigError(f"--on-stale {self.on_stale!r}: one of requeue, fail")
        _check("stale_after_s", self.stale_after_s, 2 * self.heartbeat_s, MAX_STALE_S,
               f"seconds (at least twice --heartbeat-s {self.heartbeat_s:g}: a shorter timeout would requeue "
               "trials whose worker is alive)")


def _check(name: str, value: object, low: float, high: float, unit: str) -> None:
    """``low <= value <= high`` (NaN and infinity fail), else a ConfigError naming the flag."""
    number = isinstance(value, int if name in _WHOLE else int | float) and not isinstance(value, bool)
    if not (number and low <= cast(float, value) <= high):  # (number: value is an int or a float)
        shown = f"{value:g}" if number else repr(value)
        kind = "a whole number" if name in _WHOLE else "a number"
        raise ConfigError(f"--{name.replace('_', '-')} {shown}: allowed {kind} in {low:g}..{high:g} {unit}")
