"""Ray as an executor: kvlab's own store workers, run as Ray actors, one per node.

Ray adds no second way to evaluate trials.  :class:`RayWorkers` starts one actor per usable node
of the cluster for one experiment (so one model per node, loaded once and kept across batches:
:class:`~kvlab.experiments.worker.Worker` caches its engine), each running the ordinary store
worker with ``experiment_id`` set.  The actors claim trials, write every item result and
telemetry sample to the shared store and heartbeat there, exactly as ``kvlab worker`` does, so:

* **no loss, no duplicates**: an actor whose process dies is restarted by Ray on its node
  (``max_restarts``) and its ``run`` call retried (``max_task_retries``).  Its worker id names the
  node and stays the same across the restart (:func:`kvlab.experiments.nodes.ray_worker_id`), so
  the restarted actor first gives back the trials its predecessor held; the new claim skips the
  items already stored, and the store refuses a duplicate item anyway.  A node lost for good
  stops heartbeating: the other actors requeue its trials after ``stale_after_s``.
* **cancel**: the store's cancel (dashboard, ``kvlab cancel``) reaches each actor's worker at its
  next heartbeat (``heartbeat_s``, 5 s by default), which drops the work; with ``exit_when_idle``
  the actors then return.
* **where**: ``num_cpus`` / ``num_gpus`` come from the spec's ``[resources]``; Ray sets
  ``CUDA_VISIBLE_DEVICES`` of each actor to the GPUs it granted, and a vLLM/SGLang server the
  worker launches inherits that environment, so it runs on its node's granted GPUs.

``import ray`` happens only when workers are started (:func:`import_ray`): the store commands and
the dashboard never load Ray.

A cluster address is checked before Ray connects (:func:`check_ray_address`): ``ray.init`` on an
address where nothing answers retries for minutes, a warning every 5 s, so the syntax is checked,
then a TCP connection and one gRPC call to the Ray service there must answer within
``CONNECT_TIMEOUT_S``.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from kvlab.core.backends import BACKENDS
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.errlog import one_line
from kvlab.experiments.nodes import node_of, ray_worker_id
from kvlab.experiments.worker_settings import WorkerSettings
from kvlab.secrets import redact
from kvlab.store import Store
from kvlab.store.database import require_shared_store, resolve_url, sqlite_file

INSTALL_HINT = "install it with: pip install 'kvlab[ray]'"
#: Seconds a cluster address gets to accept a connection, and then to answer one call.
CONNECT_TIMEOUT_S = 10.0
ADDRESS_FORMS = "auto, local, HOST:PORT (the head's GCS port, 6379 by default) or ray://HOST[:10001] (Ray Client)"
_HOST_PORT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
                        r"(?::(?P<port>\d{1,5}))?")  # [IPv6] or a name / IPv4, then :PORT
RAY_CLIENT_PORT = 10001
#: One cheap call to each kind of Ray server: its answer (even a refusal) says a Ray service listens.
_PROBES = {"gcs": "/ray.rpc.NodeInfoGcsService/GetClusterId", "client": "/ray.rpc.RayletDriver/ClusterInfo"}
#: Restarts of an actor whose process died, and retries of its ``run`` call, before it is reported.
MAX_RESTARTS = 3


def import_ray() -> ModuleType:
    """Ray, or a ConfigError (exit 2) saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"the Ray executor needs Ray, which is not installed here; {INSTALL_HINT}") from None
    return ray


def refuse_ray_run(address: str | None) -> None:
    """What a run on Ray is refused for before anything is stored (each a one-line error): an address
    where no cluster answers (:func:`check_ray_address`), and a store other processes cannot see (the
    actors are other processes, maybe on other hosts)."""
    check_ray_address(address)
    require_shared_store()


def check_ray_address(address: str | None) -> ModuleType:
    """Ray, once the cluster that ``ray.init(address)`` would join answers (ConfigError, exit 2, otherwise,
    within twice ``CONNECT_TIMEOUT_S``).  ``None`` and ``auto`` mean ``RAY_ADDRESS`` when set, as Ray
    reads it; ``None`` without one starts a new local cluster when none was started on this machine."""
    given, source = address, "--ray-address"
    if os.environ.get("RAY_ADDRESS") and address in (None, "auto"):
        given, source = os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    named = f"{source} {given!r}" if given is not None else "the Ray cluster recorded on this machine"
    client = given is not None and given.startswith("ray://")
    if client and given is not None:  # (client: given is a ray:// address)
        host, port = _host_port(given.removeprefix("ray://"), named, RAY_CLIENT_PORT)
    elif given not in (None, "auto", "local"):
        _host_port(given, named, None)  # the syntax, before the seconds that importing Ray takes
    ray = import_ray()
    if given == "local":
        return ray
    if client:
        _probe(host, port, "client", named)
        return ray
    from ray._private.services import canonicalize_bootstrap_address  # where ray.init connects (a private API)

    try:
        # Ray annotates addr as str; it takes None as its docstring says (RAY_ADDRESS, or the local cluster)
        target = canonicalize_bootstrap_address(given)  # type: ignore[arg-type]
    except ConnectionError:  # auto, and no cluster here
        raise ConfigError(f"{named}: no Ray cluster runs on this machine; start one with `ray start --head`, "
                          f"or give {ADDRESS_FORMS}") from None
    except ValueError as error:
        raise ConfigError(f"{named}: {one_line(str(error))}; give {ADDRESS_FORMS}") from None
    if target is not None:  # None: no cluster runs here, and ray.init starts one
        host, port = _host_port(target, named, None)
        _probe(host, port, "gcs", named)
    return ray


def _host_port(text: str, named: str, default_port: int | None) -> tuple[str, int]:
    match = _HOST_PORT.fullmatch(text)
    port = match and (match["port"] or default_port)
    if not match or port is None or not 1 <= int(port) <= 65535:
        raise ConfigError(f"{named}: not a Ray address; give {ADDRESS_FORMS}")
    return match["host"].strip("[]"), int(port)


def _probe(host: str, port: int, kind: str, named: str) -> None:
    """A TCP connection, then one gRPC call that a Ray server of ``kind`` answers; ConfigError otherwise."""
    import grpc  # Ray's own dependency

    where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    hint = ("start the cluster with `ray start --head` there, or give the address it printed" if kind == "gcs"
            else f"is the head's Ray Client server on port {RAY_CLIENT_PORT} (ray[client]) running and reachable?")
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except socket.gaierror:
        raise ConfigError(f"{named}: the host {host!r} is not known here; {hint}") from None
    except TimeoutError:
        raise ConfigError(f"{named}: {where} did not accept a connection within {CONNECT_TIMEOUT_S:g} s "
                          f"(a firewall, or a host that is down); {hint}") from None
    except OSError as error:
        raise ConfigError(f"{named}: cannot connect to {where} ({error.strerror or error}); {hint}") from None
    channel = grpc.insecure_channel(where)
    try:
        channel.unary_unary(_PROBES[kind])(b"", timeout=CONNECT_TIMEOUT_S)
    except grpc.RpcError as error:
        silent = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED)
        if error.code() in silent:  # anything else is a Ray server answering (refusing a call without its token...)
            what = "a Ray head (GCS)" if kind == "gcs" else "a Ray Client server"
            raise ConfigError(f"{named}: {where} accepts connections but does not answer as {what} within "
                              f"{CONNECT_TIMEOUT_S:g} s ({error.code().name}); {hint}") from None
        if error.code() == grpc.StatusCode.UNAUTHENTICATED and not _has_ray_token():
            raise ConfigError(f"{named}: the cluster at {where} uses token authentication and this host has no "
                              "token: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the "
                              "cluster's") from None
    finally:
        channel.close()


def _has_ray_token() -> bool:
    """Whether Ray finds an auth token here: ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ~/.ray/auth_token."""
    return bool(os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
                or (Path.home() / ".ray" / "auth_token").is_file())


@dataclass(frozen=True)
class Placement:
    """What each actor holds, and the nodes that can give it."""

    num_cpus: float
    num_gpus: float
    nodes: list[dict[str, Any]]  # ray.nodes() entries, alive and big enough


@dataclass(frozen=True)
class WorkerOutcome:
    """How one node's actor ended: ``error`` when Ray gave up on it or its worker gave up on its host;
    ``left_behind``: experiments its host could not run, with why."""

    worker_id: str
    node: str
    error: str | None = None
    left_behind: dict[int, str] | None = None


def plan_placement(spec: ExperimentSpec, nodes: list[dict[str, Any]]) -> Placement:
    """One actor per alive node that has the CPUs and GPUs the spec asks for (defaults: 1 CPU; 1 GPU for
    vllm/sglang, for device cuda, and for device auto on a cluster with GPUs)."""
    alive = [node for node in nodes if node.get("Alive")]
    resources = spec.resources
    num_cpus = resources.num_cpus if resources else 1.0
    num_gpus = resources.num_gpus if resources and resources.num_gpus is not None else None
    if num_gpus is None:
        any_gpu = any(node.get("Resources", {}).get("GPU", 0) > 0 for node in alive)
        backend = spec.backend
        wants = BACKENDS[backend.kind].wants_gpu or backend.device == "cuda"
        num_gpus = (1.0 if wants or (BACKENDS[backend.kind].loads_model_here and backend.device == "auto" and any_gpu)
                    else 0.0)
    usable = [node for node in alive if node.get("Resources", {}).get("CPU", 0) >= num_cpus
              and node.get("Resources", {}).get("GPU", 0) >= num_gpus]
    if not usable:
        raise ConfigError(f"no node of the Ray cluster ({len(alive)} alive) has {num_cpus:g} CPU(s) and "
                          f"{num_gpus:g} GPU(s) for a worker; lower [resources] num_cpus / num_gpus in the spec")
    return Placement(num_cpus, num_gpus, usable)


def actor_store_url(store_url: str | None, nodes: int) -> str:
    """The URL the actors open (``None``: ``KVLAB_DATABASE_URL``, else db/kvlab.sqlite), a SQLite path made
    absolute (an actor's working directory is Ray's); SQLite is refused on a cluster of several nodes (one
    file on one machine), and in memory on any (each actor would open an empty database of its own)."""
    require_shared_store(store_url)
    url = resolve_url(store_url)
    if url.get_backend_name() == "sqlite":
        if nodes > 1:
            raise ConfigError(f"the Ray cluster has {nodes} nodes but the store is a SQLite file, which only "
                              "one machine can open: set KVLAB_DATABASE_URL to a PostgreSQL URL all nodes reach")
        if url.query.get("uri") != "true" and (path := sqlite_file(url)) is not None:
            url = url.set(database=str(path.resolve()))
    return url.render_as_string(hide_password=False)


class NodeWorker:
    """The Ray actor: one :class:`~kvlab.experiments.worker.Worker` on its node (Ray wraps this class
    with ``ray.remote`` in :class:`RayWorkers`; it runs threaded, so ``stop`` and ``info`` answer
    while ``run`` works)."""

    def __init__(self, store_url: str, experiment_id: int, settings: WorkerSettings, token: str,
                 item_limit: int | None) -> None:
        import ray

        from kvlab.experiments.worker import Worker
        from kvlab.threads import set_torch_threads, share_cores

        share_cores()  # this process is Ray's, not the kvlab command's: before torch loads (next line)
        set_torch_threads(settings.threads)
        context = ray.get_runtime_context()
        self.worker_id = ray_worker_id(socket.gethostname(), context.get_node_id(), token)
        self.store = Store(store_url)
        self.experiment_id = experiment_id
        if context.was_current_actor_reconstructed:
            self._release_predecessors()
        self.worker = Worker(self.store, settings, worker_id=self.worker_id, experiment_id=experiment_id,
                             item_limit=item_limit)

    def _release_predecessors(self) -> None:
        """The trials the previous process of this actor held go back to the queue now, not after the
        stale timeout (Ray restarted this actor because that process died)."""
        held = [t.id for t in self.store.trials(self.experiment_id)
                if t.status == "running" and t.worker_id == self.worker_id]
        if held:
            self.store.release_trials(self.worker_id, held, "its Ray actor's process died; Ray restarted it")

    def info(self) -> dict[str, Any]:
        """The process and GPUs this actor runs with (the tests kill the process; on a GPU node
        ``cuda_visible_devices`` names the GPUs Ray granted)."""
        return {"worker_id": self.worker_id, "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def run(self) -> dict[str, Any]:
        from kvlab.experiments.worker import WorkerGaveUp

        try:
            self.worker.run()
        except WorkerGaveUp as error:
            return {"worker_id": self.worker_id, "error": one_line(str(error))}
        return {"worker_id": self.worker_id, "left_behind": self.worker.left_behind()}

    def stop(self) -> None:
        self.worker.stop()


class RayWorkers:
    """Workers of one stored experiment on a Ray cluster; a context manager (leaving it stops them).

    ``store_url``: the shared store (``None``: ``KVLAB_DATABASE_URL``, else db/kvlab.sqlite, one node only).
    ``address``: ``None`` connects to the cluster of ``RAY_ADDRESS`` or one running on this machine,
    else starts a local one; ``auto``, ``HOST:PORT`` or ``ray://HOST:10001`` (Ray Client) as Ray takes them.
    ``exit_when_idle``: the actors return once the experiment has ended (``kvlab run``); False keeps
    them polling for new trials until :meth:`stop` (a tune adds trials round by round).
    ``settings``: the workers' options; by default each claims its share of the queued trials at once
    (the embedded engine shares each item's prefill across the configs it evaluates together).
    """

    def __init__(self, store_url: str | None, experiment_id: int, spec: ExperimentSpec, address: str | None = None, *,
                 exit_when_idle: bool = True, settings: WorkerSettings | None = None,
                 item_limit: int | None = None) -> None:
        self._ray = ray = import_ray()
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            check_ray_address(address)
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            try:
                ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
            except (ConnectionError, RuntimeError, TimeoutError) as error:  # it answered the probe, then not this
                raise ConfigError(f"cannot join the Ray cluster at {address or 'RAY_ADDRESS / this machine'}: "
                                  f"{redact(one_line(str(error)))[:300]}") from None
        self.actors: list[Any] = []
        self._runs: dict[Any, Any] = {}  # run() reference: its actor
        self._stopped = False
        try:
            nodes = ray.nodes()
            self.placement = plan_placement(spec, nodes)
            url = actor_store_url(store_url, sum(bool(node.get("Alive")) for node in nodes))
            self.settings = replace(settings or self._default_settings(url, experiment_id),
                                    exit_when_idle=exit_when_idle)
            self._start(url, experiment_id, item_limit)
        except BaseException:
            self.close()
            raise

    def _default_settings(self, url: str, experiment_id: int) -> WorkerSettings:
        with Store(url) as store:
            queued = sum(t.status == "queued" for t in store.trials(experiment_id))
        share = math.ceil(queued / len(self.placement.nodes)) if queued else 1
        return WorkerSettings(max_trials=min(max(share, 1), 1000))

    def _start(self, url: str, experiment_id: int, item_limit: int | None) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor_class = self._ray.remote(NodeWorker)
        token = uuid.uuid4().hex[:6]
        for node in self.placement.nodes:
            actor = actor_class.options(
                num_cpus=self.placement.num_cpus, num_gpus=self.placement.num_gpus,
                max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS, max_concurrency=2,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            ).remote(url, experiment_id, self.settings, token, item_limit)
            self.actors.append(actor)
            self._runs[actor.run.remote()] = actor

    def info(self, timeout_s: float = 60) -> list[dict[str, Any]]:
        """Each actor's worker id, process id and ``CUDA_VISIBLE_DEVICES``."""
        return self._ray.get([actor.info.remote() for actor in self.actors], timeout=timeout_s)

    def wait(self, stop_when: Callable[[], bool] | None = None, poll_s: float = 0.5) -> list[WorkerOutcome]:
        """Until every actor has returned (with ``exit_when_idle``: the experiment ended), or ``stop_when()``
        holds (checked every ``poll_s``; then :meth:`stop`).  How each actor ended."""
        pending = list(self._runs)
        while pending:
            _, pending = self._ray.wait(pending, num_returns=len(pending), timeout=poll_s)
            if pending and stop_when is not None and stop_when():
                self.stop()
                break
        return self.outcomes()

    def outcomes(self) -> list[WorkerOutcome]:
        """How each actor that has returned ended (a restarted actor counts once, as it last ended)."""
        ready, _ = self._ray.wait(list(self._runs), num_returns=len(self._runs), timeout=0)
        outcomes = []
        for ref in ready:
            try:
                result = self._ray.get(ref)
            except Exception as error:  # noqa: BLE001 -- Ray gave up on the actor: reported, not raised
                outcomes.append(WorkerOutcome("-", "-", error=redact(one_line(str(error)))[:500]))
                continue
            worker_id = result.get("worker_id", "-")
            outcomes.append(WorkerOutcome(worker_id, node_of(worker_id), result.get("error"),
                                          result.get("left_behind")))
        return outcomes

    def stop(self, timeout_s: float = 30) -> None:
        """Ask each worker to stop (it gives its unfinished trials back at once), wait for them up to
        ``timeout_s``, then end the actors."""
        if self._stopped:
            return
        self._stopped = True
        working = self._ray.wait(list(self._runs), num_returns=len(self._runs), timeout=0)[1] if self._runs else []
        waiting = working + [self._runs[ref].stop.remote() for ref in working]
        if waiting:  # killed only once its stop has returned: a pending call would be retried and logged
            self._ray.wait(waiting, num_returns=len(waiting), timeout=timeout_s)
        for actor in self.actors:
            self._ray.kill(actor, no_restart=True)

    def close(self) -> None:
        """:meth:`stop`, then disconnect from Ray if this object connected."""
        try:
            self.stop()
        finally:
            if self._owns_ray and self._ray.is_initialized():
                self._ray.shutdown()

    def __enter__(self) -> RayWorkers:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
