"""Which machine ran a trial, read from its worker's id (the experiment page's trials table).

A plain worker's id is ``HOST-PID-RANDOM`` (:func:`kvlab.experiments.worker.new_worker_id`).  A Ray
worker's is ``ray:HOST:NODE:TOKEN`` (:func:`ray_worker_id`): the Ray node's id (first 8 hex digits)
names the node even when several nodes share a host, and the id stays the same when Ray restarts
the actor on its node, so the restarted worker can give back what its dead predecessor held.
"""

from __future__ import annotations

RAY_PREFIX = "ray:"


def ray_worker_id(host: str, node_id: str, token: str) -> str:
    """The id of the Ray worker of one :class:`~kvlab.experiments.ray_executor.RayWorkers` on one node."""
    return f"{RAY_PREFIX}{host}:{node_id[:8]}:{token}"


def node_of(worker_id: str | None) -> str:
    """``HOST (ray node NODE)`` for a Ray worker, ``HOST`` for a plain one, ``-`` for none."""
    if not worker_id:
        return "-"
    if worker_id.startswith(RAY_PREFIX):
        host, _, rest = worker_id.removeprefix(RAY_PREFIX).partition(":")
        return f"{host} (ray node {rest.partition(':')[0]})"
    parts = worker_id.rsplit("-", 2)
    return parts[0] if len(parts) == 3 else worker_id
