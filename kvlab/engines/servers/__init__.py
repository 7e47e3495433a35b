"""The serving engines kvlab launches, one module each (:mod:`.vllm`, :mod:`.sglang`, :mod:`.llamacpp`) behind
one interface (:class:`~kvlab.engines.servers.base.ServingEngine`).  Adding one is its module and its entry in the
backend registry (:data:`kvlab.core.backends.BACKENDS`, or a package's ``kvlab.backends`` entry point), whose
``server`` names the module's engine: :data:`SERVERS` is read from the registry, not listed here."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from importlib import import_module

from kvlab.core.backends import BACKENDS
from kvlab.core.errors import ConfigError
from kvlab.engines.servers.base import FormLabels, MetricNames, ServingEngine


def _load(kind: str, path: str | None) -> ServingEngine:
    """The engine a server backend's ``server`` names (``module:attribute``), checked to be that backend's."""
    module, _, attribute = (path or "").partition(":")
    if not module or not attribute:
        raise ConfigError(f"backend '{kind}' launches a server but names no engine (server = 'module:attribute')")
    try:
        engine = getattr(import_module(module), attribute, None)
    except ImportError as error:  # a plugin's engine module that is not installed here
        raise ConfigError(f"backend '{kind}': its engine {path} cannot be imported ({error})") from None
    if not isinstance(engine, ServingEngine) or engine.kind != kind:
        raise ConfigError(f"backend '{kind}': {path} is not its ServingEngine (kind '{kind}')")
    return engine


class _Servers(Mapping[str, ServingEngine]):
    """The serving engines of the registry's server backends, in its order, each imported at its first lookup."""

    def __init__(self) -> None:
        self._loaded: dict[str, ServingEngine] = {}

    def __getitem__(self, kind: str) -> ServingEngine:
        if kind not in self._loaded:
            backend = BACKENDS.get(kind)
            if backend is None or not backend.launches_server:
                raise KeyError(kind)
            self._loaded[kind] = _load(kind, backend.server)
        return self._loaded[kind]

    def __iter__(self) -> Iterator[str]:
        return (name for name, backend in BACKENDS.items() if backend.launches_server)

    def __len__(self) -> int:
        return sum(1 for _ in self)


SERVERS: Mapping[str, ServingEngine] = _Servers()


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
