"""``POST /kvlab/playground``: one item under several KV-cache configs at once, for the dashboard's playground.

The embedded engine's own path (one prefill shared by the configs, one batched decode, each config measured
against the baseline), so a run of a few configs answers in seconds on a warm server.  The item is a task's
(generated here, with the served model's tokenizer: the dashboard stays free of torch) or the caller's own
text.  Each answer comes with its measured cache, its fidelity to the baseline and the prompt positions each
KV head kept (:class:`kvlab.core.results.KeptPositions`), with the character span of every prompt token, so
a page can shade the text by what was kept.

A run is cancellable (it stops at the next attention layer: :class:`Playground`), reports how far it is
(:class:`RunProgress`, streamed to a caller that asks with ``stream``), and reuses the last run's prefill when
the next one prefills the same tokens for the same scorers (the engine's
:attr:`~kvlab.engines.embedded_session.SessionModes.reuse_prefill`: a user who changes the configs and runs the same
item again waits for no prefill), or one asked for ahead of its run (``prefill_only``: the dashboard asks for
the item it shows, so that a new item's Run finds its prefill done or under way).  A prefill ahead never delays
a run of another item, whichever client asks for either: such a run pre-empts it, queued or under way (its
client gets a 409, ``prefill_preempted``); a run of the same item leaves it to finish, and uses it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import regex
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, ValidationInfo, field_validator

from kvlab.core.errors import ConfigError
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import BASELINE, KVCacheConfig
from kvlab.core.limits import PLAYGROUND_CONFIGS, PLAYGROUND_NEW_TOKENS
from kvlab.core.results import ItemResult
from kvlab.core.tasks import (
    DEFAULT_ANSWER_SCORER,
    MAX_CONTEXT_LENGTH,
    MIN_CONTEXT_LENGTH,
    check_answer_scorer,
    generated_tasks,
)
from kvlab.engines.embedded import EmbeddedEngine
from kvlab.engines.embedded_session import SessionModes
from kvlab.serve.engine_thread import EngineLock
from kvlab.serve.errors import APIError, shutting_down
from kvlab.serve.generation import Cancelled, ServedModel, stop_between_layers
from kvlab.tasks.scoring import ScoringError, compile_answer_regex
from kvlab.tasks.single import generated_item, own_item, score
from kvlab.threads import threads_sleep


class GeneratedItem(BaseModel):
    """A task's item, generated as an experiment would (the same seed gives the same item); ``params``: the
    task's own parameters (its registry entry's model), each absent one at its default."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(description="A generated task's name (the task registry's).")
    context_length: int = Field(ge=MIN_CONTEXT_LENGTH, le=MAX_CONTEXT_LENGTH,  # a task's own bounds (TaskSpec)
                                description="The prompt's length in tokens.")
    depth: float | None = Field(default=None, ge=0, le=1, description="Where a needle task hides its needle; "
                                "unset: as the task's depths parameter gives it.")
    seed: int = Field(default=0, description="The same seed gives the same item.")
    params: dict[str, Any] = Field(default_factory=dict, description="The task's own parameters (the spec reference's "
                                   "task parameters), each absent one at its default.")


class OwnItem(BaseModel):
    """The caller's text (or a JSONL row's fields): the context is compressed, the question fed after it; an
    answer is scored as a JSONL row's would be (``prefix`` by default; ``tolerance``: the numeric scorer's)."""

    model_config = ConfigDict(extra="forbid")

    context: str = Field(min_length=1, description="The text that is compressed.")
    question: str = Field(min_length=1, description="Fed after the context is compressed.")
    # before answer, whose check reads it
    scorer: str = Field(default=DEFAULT_ANSWER_SCORER, description="The answer scorer (a JSONL row's).")
    answer: str = Field(default="", description="The expected answer; empty: not scored.")
    tolerance: float | None = Field(default=None, ge=0, description="The numeric scorer's relative tolerance.")

    @field_validator("scorer")
    @classmethod
    def _known(cls, scorer: str) -> str:
        return check_answer_scorer(scorer)

    @field_validator("answer")
    @classmethod
    def _answer_compiles(cls, answer: str, info: ValidationInfo) -> str:
        if info.data.get("scorer") == "regex":
            try:
                compile_answer_regex(answer)
            except regex.error as error:
                raise ValueError(f"answer is not a regular expression ({error})") from None
        return answer


def _item_kind(value: Any) -> str:
    """Which item a request holds: the caller's text has a context, a task's item has none (so that an error
    names the fields of the one it is, never of the other)."""
    context = value.get("context") if isinstance(value, dict) else getattr(value, "context", None)
    return "own" if context is not None else "generated"


#: The request's item, told apart by :func:`_item_kind`; an error's location leaves the tag out (``item.scorer``:
#: :data:`kvlab.serve.errors.UNION_TAGS`).
PlaygroundItem = Annotated[Annotated[GeneratedItem, Tag("generated")] | Annotated[OwnItem, Tag("own")],
                           Discriminator(_item_kind)]


class PlaygroundRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="The served model's name.")
    item: PlaygroundItem = Field(description="A task's item (task, context_length, ...) or your own text (context, "
                                 "question, ...).")
    configs: list[dict[str, Any]] = Field(default=[], max_length=PLAYGROUND_CONFIGS,
                                          description="KV-cache configs ([[configs]] entries' fields); the baseline "
                                          "runs beside them.")
    max_new_tokens: int | None = Field(default=None, ge=1, le=PLAYGROUND_NEW_TOKENS, description="New tokens at most; "
                                       "unset: the item's own budget.")
    prefill_only: bool = Field(default=False, description="Prefill the item for these configs and keep it for the "
                               "next run, which then finds it done (the dashboard asks when it shows an item, "
                               "before Run is clicked); answers {\"prefilled\": {\"context_tokens\": ...}}. A run "
                               "of another item, from any client, pre-empts it, queued or under way (a 409, code "
                               "prefill_preempted); one of the same item waits for it and uses it.")
    stream: bool = Field(default=False, description="kvlab's: answer as server-sent events, a progress event as the "
                         "run moves on ({\"progress\": {...}}), then the answer ({\"answer\": {...}}) or an error "
                         "({\"error\": {...}}), then [DONE]; closing the connection stops the run.")


def build_item(served: ServedModel, request: PlaygroundRequest) -> TaskItem:
    """The request's item (a 400 naming the field for one that cannot be built)."""
    item = request.item
    if isinstance(item, OwnItem):
        return own_item(item.context, item.question, item.answer, item.scorer, item.tolerance, request.max_new_tokens)
    try:
        return generated_item(item.task, item.context_length, item.depth, item.seed, served.tokenizer,
                              request.max_new_tokens, item.params)
    except ConfigError as error:
        where = "item.task" if item.task not in generated_tasks() else "item"
        raise APIError(400, f"{where}: {error}", param=where) from None


def configs_of(served: ServedModel, request: PlaygroundRequest) -> list[KVCacheConfig]:
    """The baseline, then the request's configs (a 400 naming the config for a bad one)."""
    configs = [BASELINE]
    for index, fields in enumerate(request.configs):
        try:
            config = KVCacheConfig(**fields)
            served.engine.check_configs([config])
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(map(str, first["loc"]))
            raise APIError(400, f"configs.{index}{'.' + where if where else ''}: "
                           f"{first['msg'].removeprefix('Value error, ')}", param=f"configs.{index}") from None
        except ConfigError as error:
            raise APIError(400, f"configs.{index}: {error}", param=f"configs.{index}") from None
        if config.label in {c.label for c in configs}:
            raise APIError(400, f"configs.{index}: {config.label} is already compared", param=f"configs.{index}")
        configs.append(config)
    return configs


@dataclass
class RunProgress:
    """How far a run is, written by the engine's thread and read from the event loop: queued for the engine, then
    the engine's phase and the config it is on (:class:`kvlab.engines.base.Engine`'s, which telemetry reads the
    same way), and the configs answered so far (the engine answers a layout's configs together, after their
    batched decode)."""

    engine: EmbeddedEngine
    total: int  # the configs, the baseline among them
    context_tokens: int
    started: bool = False
    answered: list[str] = field(default_factory=list)

    def snapshot(self) -> dict[str, Any]:
        return {"phase": self.engine.phase if self.started else "queued",
                "config": self.engine.current_config if self.started else None,
                "answered": list(self.answered), "total": self.total, "context_tokens": self.context_tokens}


@dataclass
class Prepared:
    """A request made ready to run (what can be refused is refused by then): its item, its configs (the
    baseline first) and the item's tokens with their character spans."""

    item: TaskItem
    configs: list[KVCacheConfig]
    context: Any  # the tokenizer's encoding of the context, with offsets
    question: Any
    prefill_only: bool = False

    def same_item(self, other: Prepared) -> bool:
        """Whether ``other`` prefills the same prompt (whatever its configs or budget)."""
        return (self.item.context, self.item.question) == (other.item.context, other.item.question)


class Playground:
    """The server's playground: requests checked and prepared (:meth:`prepare`, off the engine's thread), then
    run on it one at a time (:meth:`run`, the caller holding the engine), the last prefill kept for the next."""

    def __init__(self, served: ServedModel):
        self.served = served
        self._ahead: set[PlaygroundRun] = set()  # prefills asked for ahead, queued or under way
        self._ahead_lock = threading.Lock()

    def admit(self, run: PlaygroundRun) -> None:
        """``run`` asks for the engine: a prefill ahead is kept track of; any other run pre-empts every prefill
        ahead of another item (it would only delay this run: 38.5 s behind an 8K prefill, measured)."""
        with self._ahead_lock:
            if run.prepared.prefill_only:
                self._ahead.add(run)
                return
            for ahead in [a for a in self._ahead if not a.prepared.same_item(run.prepared)]:
                ahead.preempt()
                self._ahead.discard(ahead)

    def leave(self, run: PlaygroundRun) -> None:
        """``run`` is done, or its client is."""
        with self._ahead_lock:
            self._ahead.discard(run)

    def prepare(self, request: PlaygroundRequest) -> Prepared:
        """The request's item and configs, or the :class:`APIError` that refuses it."""
        served = self.served
        if request.model != served.name:
            raise APIError(404, f"The model `{request.model}` does not exist. This server serves `{served.name}`.",
                           type_="NotFoundError", param="model", code="model_not_found")
        item = build_item(served, request)
        configs = configs_of(served, request)
        try:
            served.engine.check_items([item])
        except ConfigError as refused_item:
            raise APIError(400, str(refused_item), param="item") from None  # names the item: "item passkey/...: ..."
        tokenizer = served.tokenizer
        return Prepared(item, configs, tokenizer(item.context, add_special_tokens=True, return_offsets_mapping=True),
                        tokenizer(item.question, add_special_tokens=False, return_offsets_mapping=True),
                        request.prefill_only)

    def progress_of(self, prepared: Prepared) -> RunProgress:
        return RunProgress(self.served.engine, len(prepared.configs), len(prepared.context["input_ids"]))

    def run(self, prepared: Prepared, cancelled: Callable[[], bool] = lambda: False,
            progress: RunProgress | None = None) -> dict[str, Any] | None:
        """The run's answer (JSON-ready; a prefill's ahead of its run: how many tokens it prefilled), or None once
        ``cancelled()`` or the server is stopping (checked at every attention layer: the engine is free again
        within one layer's time)."""
        engine = self.served.engine
        progress = progress or self.progress_of(prepared)
        progress.started = True
        # one prefill for both layouts, and the last run's again for the same item: answers in seconds
        modes = SessionModes(report_positions=True, share_prefill=True, reuse_prefill=True,
                             decode_threads=1 if threads_sleep() else None)
        results = []
        try:
            with (engine.session(modes),
                  stop_between_layers(engine.modules, lambda: cancelled() or self.served.stopping.is_set())):
                if prepared.prefill_only:
                    engine.prefill_ahead(prepared.item, prepared.configs)
                    return {"prefilled": {"context_tokens": progress.context_tokens}}
                for result in engine.evaluate(prepared.item, prepared.configs):
                    results.append(result)
                    progress.answered.append(result.config_name)
        except Cancelled:
            return None
        finally:
            engine.phase, engine.current_config = "idle", None
        return _answer(prepared, results)


class PlaygroundRun:
    """One request's run on the engine's thread: :meth:`start` waits for the engine (:class:`EngineLock`) and hands
    the run to its thread, which gives the engine back once the run is done; :meth:`cancel` may be called at any
    time, and must be once the caller is done with it (a client gone stops its run: the engine is free for the
    next request within one layer's time, where a run nobody waits for used to hold it to its end)."""

    def __init__(self, playground: Playground, lock: EngineLock, prepared: Prepared):
        self._playground, self._lock, self.prepared = playground, lock, prepared
        self._cancel = threading.Event()
        self._preempted = False
        self.progress = playground.progress_of(prepared)
        self._future: asyncio.Future[dict[str, Any] | None] | None = None

    def cancel(self) -> None:
        self._cancel.set()
        self._playground.leave(self)

    def preempt(self) -> None:
        """A run of another item came: this prefill ahead stops (or never starts), and says why."""
        self._preempted = True
        self._cancel.set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._playground.admit(self)
        await self._lock.acquire()
        try:
            self._future = asyncio.wrap_future(self._lock.thread.submit(self._run, loop))
        except BaseException:
            self._lock.release_from_thread(loop)
            raise

    def _run(self, loop: asyncio.AbstractEventLoop) -> dict[str, Any] | None:
        try:
            if self._cancel.is_set():  # pre-empted or given up while it waited for the engine
                return None
            return self._playground.run(self.prepared, self._cancel.is_set, self.progress)
        finally:
            self._playground.leave(self)
            self._lock.release_from_thread(loop)

    async def wait(self, timeout: float | None = None) -> bool:
        """Whether the run is done, after waiting ``timeout`` seconds at most (None: until it is)."""
        assert self._future is not None, "start() first"
        done, _ = await asyncio.wait({self._future}, timeout=timeout)
        return bool(done)

    def answer(self) -> dict[str, Any]:
        """The answer of a run that is done; the engine's error, or a 503 when the server stopped it."""
        assert self._future is not None and self._future.done()
        answer = self._future.result()
        if answer is None and self._preempted:
            raise APIError(409, "this prefill ahead (prefill_only) was pre-empted by a run of another item, which a "
                                "prefill ahead never delays; ask for it again once that run is done",
                           code="prefill_preempted")
        if answer is None:
            raise shutting_down()  # cancelled, and not by this run's client: the server is stopping
        return answer


def _answer(prepared: Prepared, results: list[ItemResult]) -> dict[str, Any]:
    """The run's JSON: the item, every prompt token's character span, and each config's answer in order."""
    item, configs, context, question = prepared.item, prepared.configs, prepared.context, prepared.question
    by_name = {r.config_name: r for r in results}
    answers = []
    for config in configs:
        result = by_name[config.label]
        fidelity = result.fidelity
        try:
            scored, error = score(item, result.generated), None
        except ScoringError as refused:  # a bound that tripped: this answer's error, the others stand
            scored, error = None, f"scoring: {refused}"
        answers.append({
            "config": config.label, "settings": config.model_dump(mode="json", exclude_defaults=True),
            "generated": result.generated, "score": scored, "error": error,
            "context_tokens": result.context_tokens, "kept_tokens": result.kept_tokens,
            "kept_fraction": result.kept_fraction, "baseline_bytes": result.baseline_kv_bytes,
            "physical_bytes": result.physical_kv_bytes, "compression_ratio": result.compression_ratio,
            "ttft_s": result.ttft_s, "tpot_s": result.tpot_s, "output_tokens": result.output_tokens,
            "mean_kl": fidelity.mean_kl if fidelity else None, "agreement": fidelity.agreement if fidelity else None,
            "query_aware": config.query_aware, "kept_positions": result.extra["kept_positions"],
        })
    return {"item": {"task": item.task, "item_id": item.item_id, "context": item.context, "question": item.question,
                     "answer": item.answer},
            "context_offsets": [list(span) for span in context["offset_mapping"]],
            "question_offsets": [list(span) for span in question["offset_mapping"]],
            "results": answers}
