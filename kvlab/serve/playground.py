"""``POST /kvlab/playground``: one item under several KV-cache configs at once, for the dashboard's playground.

The embedded engine's own path (one prefill shared by the configs, one batched decode, each config measured
against the baseline), so a run of a few configs answers in seconds on a warm server.  The item is a task's
(generated here, with the served model's tokenizer: the dashboard stays free of torch) or the caller's own
text.  Each answer comes with its measured cache, its fidelity to the baseline and the prompt positions each
KV head kept (:class:`kvlab.core.results.KeptPositions`), with the character span of every prompt token, so
a page can shade the text by what was kept.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kvlab.core.errors import ConfigError
from kvlab.core.kv_config import BASELINE, KVCacheConfig
from kvlab.core.limits import PLAYGROUND_CONFIGS
from kvlab.core.tasks import ANSWER_SCORERS, DEFAULT_ANSWER_SCORER, TASKS, TaskSpec, check_answer_scorer
from kvlab.serve.errors import APIError
from kvlab.serve.generation import ServedModel
from kvlab.tasks import TaskItem, generate_items, score_item
from kvlab.tasks.jsonl import DEFAULT_MAX_NEW_TOKENS
from kvlab.tasks.registry import resolve

#: Tokens an answer may take.
MAX_NEW_TOKENS = 256


class GeneratedItem(BaseModel):
    """A task's item, generated as an experiment would (the same seed gives the same item)."""

    model_config = ConfigDict(extra="forbid")

    task: str
    context_length: int = Field(ge=16)
    depth: float | None = Field(default=None, ge=0, le=1)
    seed: int = 0


class OwnItem(BaseModel):
    """The caller's text (or a JSONL row's fields): the context is compressed, the question fed after it; an
    answer is scored as a JSONL row's would be (``prefix`` by default; ``tolerance``: the numeric scorer's)."""

    model_config = ConfigDict(extra="forbid")

    context: str = Field(min_length=1)
    question: str = Field(min_length=1)
    answer: str = ""
    scorer: str = DEFAULT_ANSWER_SCORER
    tolerance: float | None = Field(default=None, ge=0)

    @field_validator("scorer")
    @classmethod
    def _known(cls, scorer: str) -> str:
        return check_answer_scorer(scorer)


class PlaygroundRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    item: GeneratedItem | OwnItem
    configs: list[dict[str, Any]] = Field(default=[], max_length=PLAYGROUND_CONFIGS)
    max_new_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)


def build_item(served: ServedModel, request: PlaygroundRequest) -> TaskItem:
    """The request's item (a 400 naming the field for one that cannot be built)."""
    item = request.item
    if isinstance(item, OwnItem):
        return TaskItem(task="playground", item_id="playground", context=item.context, question=item.question,
                        answer=item.answer, context_length=0, depth=None,
                        max_new_tokens=request.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
                        metadata={"scorer": item.scorer, **({} if item.tolerance is None else
                                                            {"tolerance": item.tolerance})})
    task = TASKS.get(item.task)
    if task is None or task.kind == "perplexity" or item.task == "jsonl":
        usable = ", ".join(name for name, t in TASKS.items() if t.kind != "perplexity" and name != "jsonl")
        raise APIError(400, f"item.task: {item.task!r} cannot be generated here; one of {usable}", param="item.task")
    try:
        spec = TaskSpec(name=item.task, context_lengths=[item.context_length], num_items=1,
                        **({"depths": [item.depth]} if item.depth is not None and task.needle_depths else {}))
        generated = generate_items(spec, served.tokenizer, item.seed)[0]
    except (ValidationError, ValueError, ConfigError) as error:
        raise APIError(400, f"item: {str(error).splitlines()[0]}", param="item") from None
    return replace(generated, max_new_tokens=request.max_new_tokens) if request.max_new_tokens else generated


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


def score(item: TaskItem, generated: str) -> float | None:
    """A task's own score; the caller's text by its answer scorer (None without an answer)."""
    if item.task != "playground":
        return score_item(item, generated)
    if not item.answer:
        return None
    return resolve(ANSWER_SCORERS[item.metadata["scorer"]].function)(item, generated)


def run(served: ServedModel, request: PlaygroundRequest) -> dict[str, Any]:
    """The run's answer (JSON-ready); the caller holds the engine."""
    if request.model != served.name:
        raise APIError(404, f"The model `{request.model}` does not exist. This server serves `{served.name}`.",
                       type_="NotFoundError", param="model", code="model_not_found")
    item = build_item(served, request)
    configs = configs_of(served, request)
    engine = served.engine
    try:
        engine.check_items([item])
    except ConfigError as error:
        raise APIError(400, str(error), param="item") from None  # names the item: "item passkey/...: ..."
    tokenizer = served.tokenizer
    context = tokenizer(item.context, add_special_tokens=True, return_offsets_mapping=True)
    question = tokenizer(item.question, add_special_tokens=False, return_offsets_mapping=True)
    engine.report_positions = engine.share_prefill = True  # one prefill for both layouts: answers in seconds
    try:
        results = list(engine.evaluate(item, configs))
    finally:
        engine.report_positions = engine.share_prefill = False
    by_name = {r.config_name: r for r in results}
    answers = []
    for config in configs:
        result = by_name[config.label]
        fidelity = result.fidelity
        answers.append({
            "config": config.label, "settings": config.model_dump(mode="json", exclude_defaults=True),
            "generated": result.generated, "score": score(item, result.generated),
            "context_tokens": result.context_tokens, "kept_tokens": result.kept_tokens,
            "kept_fraction": result.kept_fraction, "baseline_bytes": result.baseline_kv_bytes,
            "physical_bytes": result.physical_kv_bytes, "compression_ratio": result.compression_ratio,
            "ttft_s": result.ttft_s, "tpot_s": result.tpot_s,
            "mean_kl": fidelity.mean_kl if fidelity else None, "agreement": fidelity.agreement if fidelity else None,
            "query_aware": config.query_aware, "kept_positions": result.extra["kept_positions"],
        })
    return {"item": {"task": item.task, "item_id": item.item_id, "context": item.context, "question": item.question,
                     "answer": item.answer},
            "context_offsets": [list(span) for span in context["offset_mapping"]],
            "question_offsets": [list(span) for span in question["offset_mapping"]],
            "results": answers}
