"""The serving engines kvlab launches, one module each (:mod:`.vllm`, :mod:`.sglang`, :mod:`.llamacpp`) behind
one interface (:class:`~kvlab.engines.servers.base.ServingEngine`).  Adding one is its module, its entry here and
its entry in the backend registry (:data:`kvlab.core.backends.BACKENDS`, which holds its title and KV dtype
names)."""

from __future__ import annotations

from kvlab.core.backends import SERVER_KINDS
from kvlab.core.errors import ConfigError
from kvlab.engines.servers.base import FormLabels, MetricNames, ServingEngine
from kvlab.engines.servers.llamacpp import LLAMACPP
from kvlab.engines.servers.sglang import SGLANG
from kvlab.engines.servers.vllm import VLLM

SERVERS: dict[str, ServingEngine] = {engine.kind: engine for engine in (VLLM, SGLANG, LLAMACPP)}
assert tuple(SERVERS) == SERVER_KINDS, "every server backend has its module, and only those"


def serving_engine(kind: str) -> ServingEngine:
    """The serving engine of backend ``kind``; :class:`ConfigError` (a ValueError) for one kvlab does not launch."""
    try:
        return SERVERS[kind]
    except KeyError:
        raise ConfigError(f"server kind '{kind}': kvlab launches {', '.join(SERVERS)} servers") from None


def engine_owning(owners: list[str]) -> ServingEngine | None:
    """The serving engine whose models are ``owned_by`` one of ``owners`` (an endpoint's ``/v1/models``), if any."""
    return next((server for server in SERVERS.values() if any(o in server.owned_by for o in owners)), None)


__all__ = ["SERVERS", "engine_owning", "FormLabels", "MetricNames", "ServingEngine", "serving_engine"]
