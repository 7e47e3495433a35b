"""The ``openai_compat`` engine: task items sent to any OpenAI-compatible endpoint.

Every request streams, so TTFT is the first text chunk and TPOT the rest over the output
tokens the server reports.  The official ``openai`` client retries 429s, 5xxs and dropped
connections with exponential backoff (honouring ``Retry-After``); what still fails after
``max_retries`` either fails the item (a request the server refuses, such as a prompt that is
too long) or stops the run with :class:`EndpointError` (an endpoint that is gone, refuses the
key or lacks the model) -- results already produced are kept by the caller.

What the KV cache held is known only when the server says so: ``kvlab serve`` reports it per
request (and applies a per-request ``kv_cache`` config); a vLLM/SGLang server kvlab launched
is described by :class:`LaunchedKV`; any other endpoint leaves the byte columns empty.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import openai

from kvlab.core.backends import launched_kinds
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import BackendSpec, ExperimentSpec
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import BASELINE, KVCacheConfig
from kvlab.core.results import MEASURED_SERVED, NOISE_FLOOR_KEY, NOISE_FLOOR_NOTE_KEY, ItemResult, KVMeasurement
from kvlab.engines.base import Engine, EngineFailure, TelemetrySource
from kvlab.engines.endpoint_rules import api_error_text, choose_model, server_root
from kvlab.engines.prometheus import KVLAB_SERVE, ServerMetricsSource
from kvlab.engines.server_fidelity import (
    NOT_MEASURED,
    Reference,
    ScoringUnsupported,
    ServerScorer,
    fidelity,
    item_seed,
)
from kvlab.engines.servers import engine_owning
from kvlab.engines.servers.base import ScoringAPI
from kvlab.secrets import Endpoint, redact

if TYPE_CHECKING:
    from kvlab.core.load_spec import LoadSpec
    from kvlab.load.metrics import LevelResult, ServerReading

log = logging.getLogger(__name__)

MAX_STOP_SEQUENCES = 4  # OpenAI's limit


class EndpointError(EngineFailure):
    """The endpoint failed in a way no retry fixes; the run stops (results so far are kept)."""


@dataclass(frozen=True)
class LaunchedKV:
    """The KV cache of a server kvlab launched with ``config``: bytes per token from its startup log."""

    config: KVCacheConfig
    bytes_per_token: float | None
    baseline_bytes_per_token: float | None  # the same cache at 16 bits
    source: str  # the log line the figures came from

    def measure(self, prompt_tokens: int, output_tokens: int) -> KVMeasurement:
        """An estimate: servers evict no tokens, so every prompt token stays in the (paged) pool, at
        the pool's bytes per token.  Never a measurement: no layout formula is checked against it."""
        if self.bytes_per_token is None:
            return KVMeasurement(context_tokens=prompt_tokens)
        return KVMeasurement(
            context_tokens=prompt_tokens, kept_tokens=float(prompt_tokens), kept_fraction=1.0,
            baseline_bytes=round((self.baseline_bytes_per_token or self.bytes_per_token) * prompt_tokens),
            physical_bytes=round(self.bytes_per_token * prompt_tokens),
            peak_bytes=round(self.bytes_per_token * (prompt_tokens + output_tokens)), estimated=True,
            source=f"estimated: bytes per token x prompt tokens, from {self.source}")


class OpenAICompatEngine(Engine):
    name = "openai_compat"

    def __init__(self, endpoint: Endpoint, backend: BackendSpec, tokenizer: Any, tokenizer_note: str = "",
                 launched: LaunchedKV | None = None, seed: int = 0, references: dict[str, Reference] | None = None,
                 plain_sampling: Mapping[str, Any] | None = None, scoring_api: ScoringAPI | None = None):
        """``references``: the baseline's reference of each item (:mod:`kvlab.engines.server_fidelity`), shared
        by the servers of one launched engine; a server of the baseline config (or ``kvlab serve``) adds to it.
        ``plain_sampling``: the request fields that make a launched engine's sampling plain; ``scoring_api``: the
        launched engine's own API for the estimator, where its OpenAI completions cannot answer it."""
        self.endpoint = endpoint
        self.backend = backend
        self._tokenizer = tokenizer
        self.tokenizer_note = tokenizer_note
        self.launched = launched
        self.seed = seed
        self.client = openai.OpenAI(
            base_url=endpoint.base_url, api_key=(endpoint.api_key or "").strip() or "no-key",
            max_retries=backend.max_retries, timeout=backend.request_timeout_s)
        self.model_id: str | None = endpoint.model_id
        self.server_info: dict[str, Any] | None = None  # kvlab serve's `kvlab` block of /v1/models
        self.owners: list[str] = []  # the owned_by of its /v1/models entries (which engine serves)
        self._probed = False
        self._in_flight = 0  # requests in flight: the phase is "request" while there are any
        self._in_flight_lock = threading.Lock()
        self.references: dict[str, Reference] = references if references is not None else {}
        self._reference_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self.scorer = ServerScorer(self.client, self._model, self._scoring_fields, plain_sampling, scoring_api)

    # -- Engine protocol -----------------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def describe(self) -> dict[str, Any]:
        self.probe()
        info: dict[str, Any] = {"engine": self.name, "base_url": self.endpoint.base_url, "model": self.model_id,
                                "api_key": self.endpoint.key_source, "tokenizer": self.tokenizer_note,
                                "max_concurrency": self.backend.max_concurrency}
        if self.server_info:
            info["server"] = self.server_info.get("engine", {}) | {"per_request_kv_cache": True}
        if self.launched:
            info["kv_pool"] = self.launched.source
        if self.scorer.probed:
            info["fidelity"] = self.scorer.why_not() or self.scorer.estimator
        return info

    def close(self) -> None:
        self.client.close()

    def telemetry_sources(self) -> list[TelemetrySource]:
        """``kvlab serve`` publishes the bytes its cache holds; other endpoints' metrics are their own."""
        self.probe()
        if self.server_info is None:
            return []
        return [ServerMetricsSource(server_root(self.endpoint.base_url), KVLAB_SERVE)]

    def check_configs(self, configs: Sequence[KVCacheConfig]) -> None:
        self.probe()
        for config in configs:
            if self.launched is not None:
                if config.label != self.launched.config.label:
                    raise ConfigError(f"{config.label}: this server was launched with {self.launched.config.label}")
            elif not self.per_request_configs and not config.is_baseline:
                raise ConfigError(
                    f"{config.label}: the endpoint {self.endpoint.base_url} decides its own KV cache, so kvlab "
                    "cannot apply this config there. Against it run only the baseline config (recorded as the "
                    "server's own cache); to compare configs use `kvlab serve` (applies a config per request) or "
                    f"backend kind {launched_kinds()} (kvlab launches the server with --kv-cache-dtype)")

    def check_items(self, items: Sequence[TaskItem]) -> None:
        refuse_perplexity(items)

    def evaluate(self, item: TaskItem, configs: Sequence[KVCacheConfig]) -> Iterator[ItemResult]:
        for config in configs:
            yield self._complete(item, config)

    def evaluate_many(self, work: Iterable[tuple[TaskItem, Sequence[KVCacheConfig]]]
                      ) -> Generator[tuple[TaskItem, ItemResult], None, None]:
        """Up to ``max_concurrency`` requests in flight; results in the order they finish.
        Closing the iterator early cancels what has not started."""
        jobs = ((item, config) for item, configs in work for config in configs)
        with ThreadPoolExecutor(self.backend.max_concurrency, thread_name_prefix="kvlab-request") as pool:
            pending: dict[Future[ItemResult], TaskItem] = {}
            try:
                while True:
                    while len(pending) < self.backend.max_concurrency and (job := next(jobs, None)):
                        pending[pool.submit(self._complete, *job)] = job[0]
                    if not pending:
                        return
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in finished:
                        yield pending.pop(future), future.result()
            finally:
                for future in pending:
                    future.cancel()

    def measure_load(self, config: KVCacheConfig, items: Sequence[TaskItem], load: LoadSpec, seed: int,
                     done: Collection[tuple[str, float]] = (), *, fields: Mapping[str, Any] | None = None,
                     watch: Callable[[], Callable[[], ServerReading]] | None = None
                     ) -> Generator[LevelResult, None, None]:
        """The endpoint under each level of ``load`` (:func:`kvlab.load.client.run_level`) but those ``done``, the
        items' prompts (context and question, as their requests send them) in turn.  ``fields``: the server's own
        request fields (``ignore_eos``); ``watch``: what reads the server meanwhile (a launched one's
        ``/metrics``; an endpoint whose models a serving engine owns is read by that engine's metric names, with its
        fields).  ``kvlab serve`` is refused: it runs one request at a time, with no serving scheduler."""
        from kvlab.load.client import run_level

        self.probe()
        if self.per_request_configs:
            raise ConfigError("this endpoint is kvlab serve, which runs one request at a time with no serving "
                              "scheduler: measure load on vLLM, SGLang or another serving engine; the experiment "
                              "page's Capacity section computes what each config fits")
        assert self.model_id is not None
        if watch is None and (server := engine_owning(self.owners)) is not None:  # a running vLLM or SGLang
            from kvlab.engines.load_monitor import watch_server

            fields, watch = server.load_fields, watch_server(server_root(self.endpoint.base_url), server.kind)
        prompts = [item.context + item.question for item in items]
        if load.requests > len(set(prompts)):
            log.warning("load: %d requests per level over %d distinct prompts: a server that caches prefixes serves "
                        "the repeats from its cache, and a bigger pool caches more (for a load without reuse: more "
                        "items, or backend.server.prefix_cache = false)", load.requests, len(set(prompts)))
        key = (self.endpoint.api_key or "").strip()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        levels = load.levels()
        floor_at = _floor_level(levels) if config.is_baseline else None
        for mode, level in levels:
            if (mode, level) in done:
                continue
            result = run_level(self.endpoint.base_url, self.model_id, prompts, mode, level, load.requests,
                               load.output_tokens, fields=fields, headers=headers, seed=seed, watch=watch)
            if (mode, level) == floor_at:
                result = replace(result, **self._floor_under_load(items, prompts, int(level), load.output_tokens,
                                                                  fields, headers))
            elif floor_at is None and config.is_baseline and (mode, level) == levels[0]:
                result = replace(result, noise_floor_note=f"{FLOOR_UNDER_LOAD_UNMEASURED} (it is measured beside a "
                                 "closed level's clients; this load has open levels only)")
            yield result

    def _floor_under_load(self, items: Sequence[TaskItem], prompts: Sequence[str], clients: int, output_tokens: int,
                          fields: Mapping[str, Any] | None, headers: Mapping[str, str]) -> dict[str, Any]:
        """The engine's noise floor with other requests in flight: each item's baseline reference scored afresh
        (:meth:`ServerScorer.noise_floor`) while ``clients`` clients keep this server busy with the load's prompts
        (:func:`kvlab.load.client.run_beside`; after the level, whose figures it would otherwise disturb).  The
        fields of :class:`~kvlab.load.metrics.LevelResult` it fills: ``noise_floor`` (each item's fidelity) or
        ``noise_floor_note`` (why not)."""
        from kvlab.load.client import run_beside

        references = [ref for item in items if (ref := self.references.get(item.item_id)) is not None and ref.tokens]
        if not references:
            return {"noise_floor_note": f"{FLOOR_UNDER_LOAD_UNMEASURED} (no reference of the baseline's on these "
                                        "items)"}
        if (why := self.scorer.why_not()) is not None:
            return {"noise_floor_note": redact(f"{FLOOR_UNDER_LOAD_UNMEASURED}: the load's server answers no "
                                               f"scoring request {why.removeprefix(NOT_MEASURED).strip()}")}
        assert self.model_id is not None
        try:
            floors, served, refused = run_beside(self.endpoint.base_url, self.model_id, prompts, clients, output_tokens,
                                        lambda: [self.scorer.noise_floor(ref).to_dict() for ref in references],
                                        fields=fields, headers=headers)
        except ScoringUnsupported as error:
            return {"noise_floor_note": f"{FLOOR_UNDER_LOAD_UNMEASURED} ({error})"}
        except openai.APIError as error:
            return {"noise_floor_note": redact(f"{FLOOR_UNDER_LOAD_UNMEASURED} ({api_error_text(error)})")}
        if refused and not served:
            return {"noise_floor_note": f"{FLOOR_UNDER_LOAD_UNMEASURED} (the server refused the load's requests beside "
                                        "the scoring; the level's errors say why)"}
        return {"noise_floor": floors}

    # -- the endpoint ----------------------------------------------------------------------------

    def probe(self) -> None:
        """Learn the model id (and whether this is ``kvlab serve``) from ``/v1/models``, once."""
        if self._probed:
            return
        try:
            models = list(self.client.models.list())
        except openai.APIError as error:
            raise EndpointError(self._explain(error)) from None
        choice = choose_model(self.model_id, [m.id for m in models])
        if choice.model is None:
            raise ConfigError(choice.refusal(self.endpoint.base_url))
        self.model_id = choice.model
        self.owners = [str(m.owned_by) for m in models if getattr(m, "owned_by", None)]
        entry = next((m for m in models if m.id == self.model_id), None)
        extra = (entry.model_extra or {}) if entry is not None else {}
        self.server_info = extra.get("kvlab") if isinstance(extra.get("kvlab"), dict) else None
        self._probed = True

    @property
    def per_request_configs(self) -> bool:
        """Whether each request carries its config: ``kvlab serve`` applies them; a launched server has one."""
        return self.server_info is not None and self.launched is None

    def _explain(self, error: openai.APIError) -> str:
        """What went wrong, in one line without secrets (servers echo keys and URLs in their errors)."""
        return redact(self._describe(error))

    def _describe(self, error: openai.APIError) -> str:
        where = self.endpoint.base_url
        hint = f"run `kvlab doctor --base-url {where}` for a diagnosis"
        if isinstance(error, openai.AuthenticationError | openai.PermissionDeniedError):
            unsent = ("; the user:password that was in the base URL is not sent (kvlab authenticates with the key "
                      "only)" if self.endpoint.dropped_credentials else "")
            return (f"{where} refused the API key ({self.endpoint.key_source}, {self.endpoint.masked_key}): "
                    f"{api_error_text(error)}{unsent}; {hint}")
        if isinstance(error, openai.NotFoundError):
            return f"{where}: not found ({api_error_text(error)}); check the base URL and the model id; {hint}"
        if isinstance(error, openai.APITimeoutError):
            return f"{where} did not answer within {self.backend.request_timeout_s:g} s; {hint}"
        if isinstance(error, openai.APIConnectionError):
            return f"{where} cannot be reached ({error.__cause__ or error}); is the server running? {hint}"
        return f"{where}: {type(error).__name__}: {api_error_text(error)}; {hint}"

    def _complete(self, item: TaskItem, config: KVCacheConfig) -> ItemResult:
        self.probe()
        with self._in_flight_lock:
            self._in_flight += 1
            self.phase, self.current_config = "request", config.label
        try:
            return self._request(item, config)
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1
                if not self._in_flight:
                    self.phase, self.current_config = "idle", None

    def _request(self, item: TaskItem, config: KVCacheConfig) -> ItemResult:
        prompt = item.context + item.question
        extra_body = None
        if self.per_request_configs:  # kvlab serve: this config, and the same cache layout as embedded
            extra_body = {"kv_cache": config.model_dump(mode="json"), "kv_cache_question_chars": len(item.question)}
        started = time.perf_counter()
        first_at: float | None = None
        text, pieces, usage, reported = "", 0, None, None  # reported: kvlab serve's kv_cache block
        assert self.model_id is not None  # probe() (in _complete) chose it
        stream = None
        try:
            stream = self.client.completions.create(
                model=self.model_id, prompt=prompt, max_tokens=item.max_new_tokens, temperature=0,
                seed=self.seed, stop=list(item.stop[:MAX_STOP_SEQUENCES]) or None, stream=True,
                stream_options={"include_usage": True}, extra_body=extra_body)
            for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    first_at = first_at or time.perf_counter()
                    text += chunk.choices[0].text
                    pieces += 1
                usage = chunk.usage or usage
                reported = (chunk.model_extra or {}).get("kv_cache") or reported
        except (openai.BadRequestError, openai.UnprocessableEntityError) as error:
            return self._failed(item, config, redact(f"{type(error).__name__}: {api_error_text(error)}"))
        except openai.APIError as error:
            if _error_event(error):  # the server refused this request inside its streamed 200 (vLLM's shape)
                return self._failed(item, config, redact(f"the server refused it mid-answer: {api_error_text(error)}"))
            if stream is not None and isinstance(error, openai.APIConnectionError):  # the answer had begun
                raise EndpointError(redact(f"{self.endpoint.base_url} broke off a streamed answer "
                                           f"({error.__cause__ or error}); is the server still running?")) from None
            raise EndpointError(self._explain(error)) from None
        except Exception as error:  # noqa: BLE001 -- a stream cut mid-answer raises the transport's own errors
            raise EndpointError(redact(f"{self.endpoint.base_url} broke off a streamed answer "
                                       f"({type(error).__name__}: {error}); is the server still running?")) from None
        ended = time.perf_counter()
        output_tokens = usage.completion_tokens if usage else pieces
        prompt_tokens = usage.prompt_tokens if usage else len(self._tokenizer(prompt)["input_ids"])
        ttft = (first_at or ended) - started
        decode_s = ended - first_at if first_at else 0.0
        kv, prefill_s, compress_s = self._measure(prompt_tokens, output_tokens, reported)
        fields = kv.result_fields()
        fields["extra"] = fields.get("extra", {}) | self._fidelity(item, config)
        return ItemResult(
            item_id=item.item_id, task=item.task, config_name=config.label, config=config.model_dump(mode="json"),
            seed=self.seed, context_length=item.context_length, depth=item.depth, prompt_tokens=prompt_tokens,
            generated=text, answer=item.answer, output_tokens=output_tokens, ttft_s=ttft,
            tpot_s=decode_s / (output_tokens - 1) if output_tokens > 1 and first_at else None,
            prefill_s=prefill_s, compress_s=compress_s, decode_s=decode_s, peak_memory_bytes=None,
            **fields,
        )

    # -- fidelity (the sampled estimator) ----------------------------------------------------------

    @property
    def makes_references(self) -> bool:
        """Whether this server is the baseline's: ``kvlab serve`` (any config per request) or a launched server
        of the baseline config."""
        return self.per_request_configs or (self.launched is not None and self.launched.config.is_baseline)

    def _model(self) -> str:
        self.probe()
        assert self.model_id is not None
        return self.model_id

    def _scoring_fields(self, item: TaskItem | None, config: KVCacheConfig,
                        reference: Reference | None) -> dict[str, Any] | None:
        """kvlab serve's fields of a sampling (``item``) or scoring (``reference``) request under ``config``."""
        if not self.per_request_configs:
            return None
        fields: dict[str, Any] = {"kv_cache": config.model_dump(mode="json")}
        if item is not None:
            fields["kv_cache_question_chars"] = len(item.question)
        if reference is not None and reference.split is not None:
            fields["kv_cache_prompt_split"] = list(reference.split)
        return fields

    def reference(self, item: TaskItem) -> Reference:
        """The baseline's reference of ``item`` (sampled and scored on this server once, then remembered)."""
        with self._reference_locks[item.item_id]:
            if item.item_id not in self.references:
                seed = item_seed(self.seed, item.item_id)
                self.references[item.item_id] = self.scorer.reference(item, BASELINE, seed)
            return self.references[item.item_id]

    def ensure_references(self, items: Sequence[TaskItem]) -> str | None:
        """Make the references of ``items`` that are missing (on this, the baseline's server), several requests at
        once; None, or why this server cannot (then no fidelity is measured against it)."""
        if (why := self.scorer.why_not()) is not None:
            return why
        missing = [item for item in items if item.item_id not in self.references and _measurable(item)]
        with ThreadPoolExecutor(self.backend.max_concurrency, thread_name_prefix="kvlab-reference") as pool:
            for future in [pool.submit(self._guarded_reference, item) for item in missing]:
                future.result()
        return None

    def _guarded_reference(self, item: TaskItem) -> Reference:
        try:
            return self.reference(item)
        except openai.APIError as error:
            raise EndpointError(self._explain(error)) from None

    def _fidelity(self, item: TaskItem, config: KVCacheConfig) -> dict[str, Any]:
        """``{"fidelity": ...}`` of ``config`` against the baseline's reference on ``item``, ``{"fidelity_note": why}``
        where it cannot be measured; for the baseline itself on its server, the reference it makes there
        (``{"fidelity_reference": ...}``: the tokens another engine can score later)."""
        if not _measurable(item) or not (self.makes_references or self.launched is not None):
            return {}  # an endpoint that serves one config it chose: nothing to compare it with
        if (why := self.scorer.why_not()) is not None:
            return {"fidelity_note": why}
        try:
            if config.is_baseline:
                return self._reference_and_floor(item) if self.makes_references else {}
            reference = self.reference(item) if self.makes_references else self.references.get(item.item_id)
            if reference is None:
                return {"fidelity_note": "no reference from the baseline's server for this item"}
            if not reference.tokens:
                return {"fidelity_note": "the baseline's sample held no token"}
            logprobs, top1 = self.scorer.score(reference, config)
            return {"fidelity": fidelity(reference, logprobs, top1).to_dict()}
        except ScoringUnsupported as error:
            return {"fidelity_note": f"{NOT_MEASURED} ({error})"}
        except (openai.BadRequestError, openai.UnprocessableEntityError) as error:
            return {"fidelity_note": redact(f"{NOT_MEASURED} ({api_error_text(error)})")}
        except openai.APIError as error:
            raise EndpointError(self._explain(error)) from None

    def _reference_and_floor(self, item: TaskItem) -> dict[str, Any]:
        """The baseline's reference of ``item`` (``fidelity_reference``) and the engine's noise floor on it
        (``noise_floor``: the baseline against itself, :meth:`ServerScorer.noise_floor`; ``noise_floor_note``
        where this server cannot score afresh)."""
        reference = self.reference(item)
        found: dict[str, Any] = {"fidelity_reference": reference.to_dict()}
        if not reference.tokens:
            return found
        try:
            found[NOISE_FLOOR_KEY] = self.scorer.noise_floor(reference).to_dict()
        except ScoringUnsupported as error:
            found[NOISE_FLOOR_NOTE_KEY] = f"noise floor not measured ({error})"
        except (openai.BadRequestError, openai.UnprocessableEntityError) as error:
            found[NOISE_FLOOR_NOTE_KEY] = redact(f"noise floor not measured ({api_error_text(error)})")
        return found

    def _measure(self, prompt_tokens: int, output_tokens: int, reported: Any
                 ) -> tuple[KVMeasurement, float, float]:
        """What the cache held, as far as the server lets kvlab know (None where it does not), and
        the server's own prefill and compression seconds (NaN where it does not say)."""
        if isinstance(reported, dict) and self.per_request_configs:
            # kvlab serve: measured on the server, with the same cache layout as the embedded engine
            try:
                kv = KVMeasurement.from_dict(reported, default_source=MEASURED_SERVED)
            except ValueError as error:
                raise EndpointError(redact(f"{self.endpoint.base_url} sent a kv_cache block kvlab cannot read "
                                           f"({error}); is it another kvlab version?")) from None
            return kv, _seconds(reported.get("prefill_s")), _seconds(reported.get("compress_s"))
        if self.launched is not None:
            return self.launched.measure(prompt_tokens, output_tokens), math.nan, math.nan
        return KVMeasurement(context_tokens=prompt_tokens), math.nan, math.nan

    def _failed(self, item: TaskItem, config: KVCacheConfig, error: str) -> ItemResult:
        return ItemResult(
            item_id=item.item_id, task=item.task, config_name=config.label, config=config.model_dump(mode="json"),
            seed=self.seed, context_length=item.context_length, depth=item.depth, prompt_tokens=0, generated="",
            answer=item.answer, output_tokens=0, ttft_s=math.nan, tpot_s=None, prefill_s=math.nan,
            compress_s=math.nan, decode_s=math.nan, peak_memory_bytes=None, error=error,
            **KVMeasurement(context_tokens=0).result_fields())


def _measurable(item: TaskItem) -> bool:
    """Whether fidelity applies to ``item``: not a conversation's later turn (its history is each config's own)."""
    return not item.multi_turn


def refuse_perplexity(items: Sequence[TaskItem]) -> None:
    if any(item.kind == "perplexity" for item in items):
        raise ConfigError("perplexity needs the log-probabilities of the prompt, which kvlab does not read over "
                          "the OpenAI API; run perplexity tasks on the embedded backend")


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


#: How a load level's note begins where the engine's noise floor under load is not measured beside it.
FLOOR_UNDER_LOAD_UNMEASURED = "noise floor under load not measured"


def _floor_level(levels: Sequence[tuple[str, float]]) -> tuple[str, float] | None:
    """The level the noise floor under load is measured beside: the closed level of the most clients (None for a
    load of open levels only)."""
    return max((pair for pair in levels if pair[0] == "closed"), key=lambda pair: pair[1], default=None)


def _error_event(error: openai.APIError) -> bool:
    """Whether ``error`` is an error event read inside a streamed answer (``data: {"error": {...}}``, which the
    ``openai`` client raises as a bare :class:`openai.APIError` carrying the event's body), not a status or a
    transport failure."""
    return type(error) is openai.APIError and isinstance(error.body, dict)


def build(spec: ExperimentSpec) -> OpenAICompatEngine:
    """Connect to the spec's endpoint (the backend registry's ``openai_compat`` entry)."""
    from kvlab.engines.factory import openai_endpoint, task_tokenizer

    backend = spec.backend
    tokenizer, note = task_tokenizer(spec.model)
    endpoint = openai_endpoint(backend.base_url, backend.model_id, backend.api_key_env)
    if endpoint.dropped_credentials:
        log.warning("the base URL holds a user:password, which kvlab never sends: requests to %s authenticate "
                    "with the key in %s as a Bearer token", endpoint.base_url, backend.api_key_env)
    return OpenAICompatEngine(endpoint, backend, tokenizer, note, seed=spec.seed)
