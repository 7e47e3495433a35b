"""Checks this host could not run, and why: said in the test run's summary, never skipped in silence.

A test that runs another branch because the host lacks a capability (vLLM's fp8 KV cache on a CPU without
AVX-512 or AMX) calls :func:`could_not_run`; ``tests/conftest.py`` prints the list at the end of the run.
"""

from __future__ import annotations

COULD_NOT_RUN: dict[str, str] = {}


def could_not_run(check: str, why: str) -> None:
    """Record that this host could not run ``check`` because ``why`` (each check once)."""
    COULD_NOT_RUN.setdefault(check, why)
