"""Command lines for the serving engines kvlab launches as subprocesses (vLLM, SGLang, llama.cpp).

Each engine's flags were read from its sources and live in its module (:mod:`kvlab.engines.servers`,
each mapping citing the file and definition it comes from); here is what every launch shares: a config
checked against what the engine stores, the flags kvlab owns refused in ``extra_args``, the argv and the
environment.  No engine is imported: kvlab drives each over HTTP, and neither imports without CUDA torch.

What the engines can and cannot do is refused *before* a server starts, with a message that
names what the engine does support: a GPU start-up takes minutes, a wrong flag costs all of it.
"""

from __future__ import annotations

from kvlab.core.axis import choice_key
from kvlab.core.backends import rotating_kinds
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ServerOptions
from kvlab.core.formats import FORMATS
from kvlab.core.kv_config import KVCacheConfig, also_axes
from kvlab.engines.servers import SERVERS, serving_engine
from kvlab.engines.servers.installs import Installed
from kvlab.threads import beside_others


def check_config(kind: str, config: KVCacheConfig) -> None:
    """Raise :class:`ConfigError` if the engine cannot run ``config``, naming what it does support."""
    server = serving_engine(kind)
    engine = server.title
    label = config.label
    own = [quant for quant in server.kv_dtypes if FORMATS[quant].kind == "engine"]
    supported = ", ".join(q for q in server.kv_dtypes if q not in own) + (
        f" and {len(own)} of its own (`kvlab engines`)" if own else "")
    if config.rotation is not None and server.rotation_off_env is None:
        raise ConfigError(f"config '{label}': rotation = {str(config.rotation).lower()} cannot run on {engine}: it has "
                          f"no rotation setting kvlab knows; run it with backend kind {rotating_kinds()}")
    if config.evict != "none":
        raise ConfigError(
            f"config '{label}': evict = '{config.evict}' cannot run on {engine}: {server.no_eviction}. "
            "Run token eviction with backend kind 'embedded'."
        )
    if config.value_quant is not None and not server.separate_kv:
        raise ConfigError(f"config '{label}': value_quant = '{config.value_quant}' cannot run on {engine}: one "
                          "cache dtype stores keys and values alike. Run it with backend kind 'embedded'.")
    if config.skip_layers is not None and server.skip_layers_flag is None:
        raise ConfigError(f"config '{label}': skip_layers ({config.skip_layers.label}) cannot run on {engine}: it "
                          "has no flag that keeps some layers' cache 16-bit. Run it with backend kind 'embedded'.")
    for axis in also_axes():
        if (value := getattr(config, axis.field)) is not None and not server.honours(axis.field):
            raise ConfigError(f"config '{label}': {axis.field} = {choice_key(value)} cannot run on {engine}: kvlab "
                              f"does not set it there. Drop it, or run it with backend kind 'embedded' where "
                              f"kvlab's cache stores it.")
    if config.quant in server.kv_dtypes and config.value_format in server.kv_dtypes:
        return
    if config.quant == "fp8":  # only reachable by bypassing validation: KVCacheConfig maps fp8 -> fp8_e4m3
        raise ConfigError(
            f"config '{label}': plain quant = 'fp8' is refused ({server.plain_fp8}); use fp8_e4m3 or fp8_e5m2 "
            f"({engine} runs quant = {supported})"
        )
    field, name = (("quant", config.quant) if config.quant not in server.kv_dtypes
                   else ("value_quant", config.value_format))
    fmt = FORMATS[name]
    where = "backend kind 'embedded'" if fmt.kvlab_stores else f"backend kind '{_storing_backend(name)}'"
    raise ConfigError(
        f"config '{label}': {field} = '{name}' ({fmt.description}) cannot run on {engine}: "
        f"{server.format_note(name)}. kvlab runs {field} = {supported} on {engine}; run {name} with {where}."
    )


def _storing_backend(quant: str) -> str:
    """The first backend whose server stores ``quant`` (a format kvlab's own cache does not store)."""
    return next(kind for kind, server in SERVERS.items() if quant in server.kv_dtypes)


def _check_extra_args(kind: str, extra_args: list[str]) -> None:
    """Key flags are refused outright (a command line is readable by every user of the machine: ps,
    /proc/PID/cmdline), and so are the flags kvlab sets itself: argparse keeps the last value, so a repeat
    would silently override kvlab's, and the results would record a configuration the server did not run."""
    server = serving_engine(kind)
    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if flag in server.key_flags:
            raise ConfigError(f"server.extra_args: {flag} refused: an API key on a command line is visible "
                              f"to every user of the machine (ps); {server.key_flags[flag]}")
        if flag in server.own_flags:
            raise ConfigError(f"server.extra_args: kvlab sets {flag} itself from {server.own_flags[flag]}; "
                              "set it there")


def server_command(
    kind: str,
    model: str,
    config: KVCacheConfig,
    options: ServerOptions,
    port: int,
    served_model_name: str,
    seed: int = 0,
    *,
    dtype: str = "auto",
    installed: Installed | None = None,
    num_layers: int | None = None,
    kv_budget: tuple[int, float | None] | None = None,
) -> list[str]:
    """The argv that starts the engine's OpenAI-compatible server for one KV-cache config.

    ``port`` is the real port (``server.port`` may be 0, meaning "pick one": the caller resolves it
    with :func:`kvlab.engines.managed_server.free_port`).  ``dtype`` is the spec's ``backend.dtype``;
    ``installed``: the server install (default: ``server.python``, not the CPU build); ``num_layers``: the
    model's, which a config's 16-bit last layers need (``skip_layers.last``); ``kv_budget``: a ``[load]`` table's
    budget in bytes and the config's pool bytes per token (the engine's own flag sizes the pool:
    :meth:`~kvlab.engines.servers.base.ServingEngine.with_budget`).  No API key ever appears here.
    """
    installed = installed or Installed(options.python or "python")
    server = serving_engine(kind)
    check_config(kind, config)
    _check_extra_args(kind, options.extra_args)
    server.check_options(options)
    if not 0 < port < 65536:
        raise ConfigError(f"server port {port}: give a port in 1..65535")
    budget_args: list[str] = []
    if kv_budget is not None:
        options, budget_args = server.with_budget(options, *kv_budget)
    argv = [installed.python, *server.entry(), "--host", options.host, "--port", str(port)]
    kv_dtypes = (server.kv_dtypes[config.quant], server.kv_dtypes[config.value_format])
    argv += server.launch_args(model, kv_dtypes, options, installed, dtype, served_model_name, seed)
    if (skip := config.skip_layers) is not None and server.skip_layers_flag is not None:
        if num_layers is None:
            raise ConfigError(f"config '{config.label}': skip_layers needs the model's layer count, which kvlab reads "
                              f"from a local model only (give the layers by index: skip_layers.layers)")
        if problem := skip.check(num_layers):
            raise ConfigError(f"config '{config.label}': {problem}")
        argv += [server.skip_layers_flag, *map(str, sorted(skip.indices(num_layers)))]
    return argv + budget_args + list(options.extra_args)


def server_env(kind: str, installed: Installed, local_model: bool, config: KVCacheConfig | None = None
               ) -> dict[str, str]:
    """The environment a launched server gets beside this process's: no usage reports (this host may
    reach no network), its OpenMP threads asleep when idle as they were before kvlab chose a policy per process
    (:func:`kvlab.threads.beside_others`: the policy kvlab chose for itself is not the engine's), the engine's own
    (:meth:`~kvlab.engines.servers.base.ServingEngine.launch_env`), for a model kvlab resolved to a local directory
    no hub (``HF_HUB_OFFLINE``, so nothing waits on an unreachable one), and for ``config`` with
    ``rotation = false`` the engine's switch that turns it off."""
    server = serving_engine(kind)
    rotation_off = dict(server.rotation_off_env or {}) if config is not None and config.rotation is False else {}
    return ({"DO_NOT_TRACK": "1"} | beside_others() | ({"HF_HUB_OFFLINE": "1"} if local_model else {})
            | server.launch_env(installed) | rotation_off)


def health_path(kind: str) -> str:
    """The path that answers 200 only once the server can serve requests (the engine's own)."""
    return serving_engine(kind).health_path
