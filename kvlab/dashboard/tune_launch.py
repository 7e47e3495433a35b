"""What a tune launched from the dashboard carries: an event saying so, with its process's log
(:data:`LAUNCH_EVENT`, recorded by :func:`kvlab.dashboard.launch.launch_tune`), which the tune page reads.
"""

from __future__ import annotations

from pathlib import Path

from kvlab.store import ExperimentStore

#: The event a tune launched from the dashboard carries (its origin: ``kvlab tune`` records the rest).
LAUNCH_EVENT = "launched from the dashboard (New experiment, mode Tune)"


def record_launch(store: ExperimentStore, experiment_id: int, log: Path) -> None:
    store.log_event(experiment_id, f"{LAUNCH_EVENT}; the process's log: {log}")


def launched_here(store: ExperimentStore, experiment_id: int) -> bool:
    """Whether the dashboard launched this tune (else ``kvlab tune`` in a terminal, or a script)."""
    return any(event.message.startswith(LAUNCH_EVENT) for event in store.events(experiment_id))
