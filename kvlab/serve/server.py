"""uvicorn for ``kvlab serve``, stopping within seconds even with requests in flight.

On SIGTERM or Ctrl-C every generation is told to stop at once (within one token; requests in
flight get a 503 or a 503 error event), and whatever is still running after
:data:`SHUTDOWN_GRACE_S` -- a long prefill cannot be interrupted -- is cancelled; its daemon
thread does not hold the process.
"""

from __future__ import annotations

import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI

from kvlab.core.errors import ConfigError
from kvlab.serve.generation import ServedModel

SHUTDOWN_GRACE_S = 2.0


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, served: ServedModel):
        super().__init__(config)
        self._served = served

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._served.stopping.set()
        super().handle_exit(sig, frame)


def check_address(host: str, port: int) -> None:
    """Refuse a host or port this process cannot listen on, before minutes of model loading."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind((host, port))
    except OSError as error:
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({error.strerror or error})") from None


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::", ""})


def names_of(host: str) -> frozenset[str]:
    """The ``Host`` names a client of address ``host`` sends: a loopback address's loopback names; a
    wildcard's every name and address of this machine (and loopback); another address itself and this
    machine's names."""
    if host in LOOPBACK_NAMES:
        return LOOPBACK_NAMES
    names = {host, socket.gethostname(), socket.getfqdn()}
    if host in WILDCARD_ADDRESSES:
        names |= LOOPBACK_NAMES
        try:
            names |= {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)}
        except OSError:  # a host name that does not resolve: its names and loopback still answer
            pass
    return frozenset(name.lower() for name in names - WILDCARD_ADDRESSES)


def serve(app: FastAPI, served: ServedModel, host: str, port: int) -> None:
    # uvicorn annotates the grace as int seconds; it is asyncio.timeout's delay, any float
    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=SHUTDOWN_GRACE_S)  # type: ignore[arg-type]
    _Server(config, served).run()
