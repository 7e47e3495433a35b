"""The task registry and TaskSpec: which tasks exist, what each reads, and which items to generate.

An entry (:class:`Task`) names the task's generator, its scorer, its known shortcuts and its item
counter as ``"module:function"`` references, in the manner of Python's entry points: this module
is pure data, so that validating a spec imports no task code, and :mod:`kvlab.tasks.registry`
resolves the references when items are made or scored.  Beside them an entry gives the chance
floor, the model of the task's own parameters (:class:`TaskParams`: ``num_pairs`` is multikey's,
``passage_words`` recall's) and the kind of its items (which fixes their prompt layout).
TaskSpec validation and its messages, item generation and counting, the scorer dispatch, the
report's chance floors, the length buckets of a file's items, the needle heatmap, and the
parameter widgets of the form and the playground read from here.  Adding a task is one module
(its generator, and its scorer if none of :mod:`kvlab.tasks.scoring` fits) plus one entry in
:data:`TASKS` with its parameter model; ``tests/tasks/test_task_registry.py`` shows that nothing
else is needed.

Why a task's parameter model is declared here, beside its entry, and not in its module: see the
comment above the models (the bottom layer validates specs and imports no task code).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Literal, Self, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from kvlab.core.limits import FieldProblem

#: What an item asks of the model: generate an answer, or give its likelihood to a continuation.
ItemKind = Literal["generate", "perplexity"]


@dataclass(frozen=True)
class AnswerScorer:
    """How a user's answer is scored (the ``scorer`` of a jsonl task or of one of its rows): ``function``
    names ``(item, generated) -> float`` in [0, 1] as ``"module:function"``; ``help`` says the rule."""

    name: str
    function: str
    help: str


#: The answer formats of a user's JSONL file.  "Normalised": lowercased, punctuation to spaces,
#: whitespace collapsed.  A completion model writes on after its answer, so the rules that compare
#: whole texts look at the output's first line.
ANSWER_SCORERS: dict[str, AnswerScorer] = {s.name: s for s in (
    AnswerScorer("prefix", "kvlab.tasks.scoring:answer_prefix",
                 "the normalised output starts with the normalised answer (at a word boundary); the default"),
    AnswerScorer("contains", "kvlab.tasks.scoring:answer_contained",
                 "the normalised answer appears in the normalised output, at word boundaries"),
    AnswerScorer("exact", "kvlab.tasks.scoring:answer_exact",
                 "the output's first line, normalised, equals the normalised answer"),
    AnswerScorer("numeric", "kvlab.tasks.scoring:answer_numeric",
                 "the output's first number equals the answer within a relative tolerance (a row's "
                 "`tolerance`, default 1e-6)"),
    AnswerScorer("regex", "kvlab.tasks.scoring:answer_regex",
                 "the answer is a regular expression that the output matches (Python re.search)"),
    AnswerScorer("choice", "kvlab.tasks.scoring:answer_choice",
                 "the output's first choice letter (B, (B), B., 'Answer: B') is the answer's letter"),
    AnswerScorer("boxed", "kvlab.tasks.scoring:answer_boxed",
                 "the output's last \\boxed{...} (nested braces kept) equals the answer, normalised or as a number; "
                 "no box scores 0 (the MATH500/AIME convention)"),
    AnswerScorer("f1", "kvlab.tasks.scoring:answer_f1",
                 "token F1 of the output's first line against the answer, both normalised (SQuAD's)"),
)}
DEFAULT_ANSWER_SCORER = "prefix"


def check_answer_scorer(name: object) -> str:
    """``name`` if it is a registered answer scorer, else a ValueError listing them."""
    if not isinstance(name, str) or name not in ANSWER_SCORERS:
        raise ValueError(f"unknown scorer {name!r}; known: {', '.join(ANSWER_SCORERS)}")
    return name


MIN_CONTEXT_LENGTH = 128
MAX_CONTEXT_LENGTH = 131072
MAX_PATH_CHARS = 4096
#: Items per context length of a generated task whose spec does not say.
DEFAULT_NUM_ITEMS = 10


# --- a task's own parameters ---------------------------------------------------------------------


class TaskParams(BaseModel):
    """A task's own parameters: the base of every task's parameter model (this one has none).

    A task's model declares its fields with their bounds, a ``title`` (the form's label) and a
    ``description`` (the form's help); the form and the playground draw one widget per field from the
    model's JSON schema (:mod:`kvlab.dashboard.task_params`), and :class:`TaskSpec` validates the rest
    of a task's table against it.  A check across fields is the model's own validator, raising
    :class:`~kvlab.core.limits.FieldProblem` to name the field it is about.  Three bases carry what
    code outside a task reads of several tasks' parameters: :class:`NeedleParams`,
    :class:`SharedContextParams` and :class:`FileParams`.
    """

    model_config = ConfigDict(extra="forbid")


class NeedleParams(TaskParams):
    """A task that hides what it asks for at one of ``depths`` (``item.depth``: the needle heatmap's)."""

    depths: list[float] = Field(
        default=[0.1, 0.5, 0.9], min_length=1, title="Needle depths (fraction of context)",
        description="Where what is asked for sits, as fractions of the context, each in [0, 1]; the items of each "
        "context length take them in turn.")

    @field_validator("depths")
    @classmethod
    def _check_depths(cls, depths: list[float]) -> list[float]:
        bad = [d for d in depths if not 0.0 <= d <= 1.0]
        if bad:
            raise ValueError(f"each depth must be a fraction in [0, 1], got {bad}")
        if len(set(depths)) != len(depths):
            raise ValueError(f"depths must be distinct, got {depths}")
        return depths


class SharedContextParams(TaskParams):
    """A task that may ask several questions of one context: the context is prefilled and compressed once,
    query-agnostically, and every question answered from that same cache."""

    questions_per_context: int = Field(
        default=1, ge=1, le=64, title="Questions per context",
        description="Questions asked of each context (different keys of one context; a file's rows sharing a "
        "`context_id`, at most this many); above 1 the context is compressed once, query-agnostically, and every "
        "question answered from that same cache (num_items counts contexts).")
    multi_turn: bool = Field(
        default=False, title="Multi-turn",
        description="With questions per context above 1: each question follows the previous answer in one "
        "conversation (else each starts from the compressed context).")

    @model_validator(mode="after")
    def _check_conversation(self) -> Self:
        if self.multi_turn and self.questions_per_context == 1:
            raise FieldProblem("multi_turn", "a conversation needs questions_per_context above 1")
        return self


class FileParams(TaskParams):
    """A task whose items come from the user's file at ``path``, not from a generator's prose."""

    path: str = Field(
        title="JSONL file", json_schema_extra={"format": "path"},
        description='A JSONL file with one {"context": ..., "question": ..., "answer": ...} object per line; a '
        "relative path is relative to the current directory (CLI) or to the data directory KVLAB_DATA_DIR "
        "(dashboard).")

    @field_validator("path")
    @classmethod
    def _check_path_text(cls, path: str) -> str:
        if len(path) > MAX_PATH_CHARS or not path.isprintable():
            raise ValueError(f"give a file path of at most {MAX_PATH_CHARS} printable characters "
                             "(no newline, tab or NUL)")
        return path


P = TypeVar("P", bound=TaskParams)


class TaskSpec(BaseModel):
    """What to generate: one task, at one or more prompt lengths.

    ``name`` is one of the task registry's (:data:`TASKS`).  The other fields are every task's; the
    rest of a task's table is the task's own parameters, validated against its entry's model
    (:attr:`Task.params`) into ``params``: an unknown key is refused with a message naming the task's
    parameters (and the tasks that take it), so that a typo in a task name cannot silently turn a
    user's file into a synthetic task.  Dumped, the parameters sit beside the common fields again, as
    a spec file writes them, so a spec's JSON round trip through the store gives back an equal spec.
    Task code reads its parameters typed with :meth:`params_as`; code that reads a concept shared by
    several tasks reads it from their base (:attr:`questions_per_context`, :attr:`Task.needle_depths`).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The task: one of the task registry's names.",
                      json_schema_extra=lambda schema: schema.update(enum=list(TASKS)))
    context_lengths: list[int] = Field(
        default=[1024],
        min_length=1,
        description="Target prompt lengths (context + question) in tokens of the model's "
        f"tokenizer, each in {MIN_CONTEXT_LENGTH}..{MAX_CONTEXT_LENGTH}. Ignored by a task that reads a file.",
    )
    num_items: int | None = Field(
        default=None,
        ge=1,
        description=f"Items per context length; unset: {DEFAULT_NUM_ITEMS}. A task that reads a file: at most "
        "this many lines of the file; unset: the whole file.",
    )
    max_new_tokens: int | None = Field(
        default=None, ge=1, le=4096, description="Generation budget; default depends on the task."
    )
    params: SerializeAsAny[TaskParams] = Field(
        default_factory=TaskParams,
        description="The task's own parameters (its entry's model); keys of the task's table in a spec file.")

    @model_validator(mode="before")
    @classmethod
    def _own_parameters(cls, data: Any, info: ValidationInfo) -> Any:
        """The common fields, and the rest of the table as the task's parameters (``params=`` a model
        instance too, as Python callers may give them).  Validated with the context :data:`STORED` (a spec
        the store holds), an older kvlab's parameters of other tasks are dropped whatever their value."""
        if not isinstance(data, dict):
            return data
        common = {key: value for key, value in data.items() if key in COMMON_FIELDS}
        table = {key: value for key, value in data.items() if key not in COMMON_FIELDS}
        given = table.pop("params", None) if isinstance(table.get("params"), TaskParams) else None
        name = data.get("name")
        task = TASKS.get(name) if isinstance(name, str) else None
        if task is None:
            return common  # the name's own check says what is wrong; no parameter can be told without it
        if isinstance(given, task.params) and not table:
            return common | {"params": given}
        stored = bool(info.context and info.context.get(STORED))
        return common | {"params": task.parse_params((given.model_dump() if given else {}) | table, stored=stored)}

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The task's table as a spec file writes it: its parameters beside the common fields."""
        data = handler(self)
        params = data.pop("params", {})
        return {**data, **params}

    @property
    def items_per_length(self) -> int:
        """Items per context length of a generated task (``num_items``, else the default).

        "Unset" is ``None``, never pydantic's ``model_fields_set``: a spec crosses the store as
        JSON, and the round trip marks every default as set.
        """
        return DEFAULT_NUM_ITEMS if self.num_items is None else self.num_items

    @property
    def questions_per_context(self) -> int:
        """Questions asked of each context: the task's own (:class:`SharedContextParams`), else one."""
        return self.params.questions_per_context if isinstance(self.params, SharedContextParams) else 1

    @property
    def multi_turn(self) -> bool:
        """Whether each question of a context follows the previous answer (:class:`SharedContextParams`)."""
        return isinstance(self.params, SharedContextParams) and self.params.multi_turn

    def params_as(self, model: type[P]) -> P:
        """The task's parameters, typed as ``model`` (its entry's model or a base of it); a TypeError
        for a task whose parameters are of another model (a task module called with another task's spec)."""
        if not isinstance(self.params, model):
            raise TypeError(f"the {self.name} task's parameters are {type(self.params).__name__}, "
                            f"not {model.__name__}")
        return self.params

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if name not in TASKS:
            raise ValueError(f"unknown task {name!r}; known: {', '.join(TASKS)}")
        return name

    @field_validator("context_lengths")
    @classmethod
    def _check_lengths(cls, lengths: list[int]) -> list[int]:
        bad = [n for n in lengths if not MIN_CONTEXT_LENGTH <= n <= MAX_CONTEXT_LENGTH]
        if bad:
            raise ValueError(
                f"each context length must be in {MIN_CONTEXT_LENGTH}..{MAX_CONTEXT_LENGTH} "
                f"tokens, got {bad}"
            )
        if len(set(lengths)) != len(lengths):
            raise ValueError(f"context lengths must be distinct, got {lengths}")
        return lengths


#: The fields of every task's table (the rest of it is the task's own parameters).
COMMON_FIELDS = frozenset(TaskSpec.model_fields) - {"params"}

#: Until tasks declared their own parameters (2026-12-04), every task's table held every task's, at these
#: defaults when not set: the spec files kvlab wrote (`kvlab show`, the dashboard's download) and the store's
#: specs carry them.  Read, a task's table drops those it does not take at these values.  A spec the store
#: holds drops them at any value (validated with the context :data:`STORED`): kvlab wrote it, and the task
#: ignored them (the dashboard's form sent its depths and key-value pairs to every task).
LEGACY_DEFAULTS: dict[str, Any] = {
    "depths": [0.1, 0.5, 0.9], "num_pairs": 4, "num_chains": 4, "num_hops": 4, "continuation_tokens": 64,
    "passage_words": 48, "questions_per_context": 1, "multi_turn": False, "path": None, "scorer": None}
#: The validation context key of a spec read back from the store (``parse_spec(data, stored=True)``).
STORED = "stored"


@dataclass(frozen=True)
class Task:
    """One task.

    ``generate`` names a function ``(spec, tokenizer, seed) -> list[TaskItem]`` that makes its
    items, the same for the same arguments.  ``scorer`` names ``(item, generated) -> float``, the
    score of a generated answer in [0, 1]; None for a task whose items are of kind ``"perplexity"``
    (their NLL is the measure).  ``kind`` is the kind of its items, and so their prompt layout
    (:class:`~kvlab.core.items.TaskItem`): ``"generate"`` is a context then a question ending in
    the answer prefix, in two layouts (query-agnostic: the question is fed after the context is
    compressed; query-aware: all but its last token are prefilled with the context);
    ``"perplexity"`` is a context then a continuation whose likelihood is measured, one layout (no
    question: query-aware configs run query-agnostic).  ``params``: the model of its own parameters
    (:class:`TaskParams`), which its spec's ``params`` is; the form and the playground draw its
    widgets from it.  ``chance_floor``: what answering without doing the task scores (the task
    module's docstring says why); ``shortcuts`` names ``(item) -> {shortcut: score}``, which measures
    the known ways of doing so on each item.  ``fidelity_only``: its generated answers have no
    reference, so no score; its configs are judged by fidelity to the baseline alone.
    ``count_items`` names ``(spec) -> int | None``, how many items ``spec`` makes counted without a
    tokenizer (None when that cannot be told here); unset: ``num_items`` per context length.
    ``target_lengths``: its items are made to the spec's ``context_lengths`` (else their lengths are
    measured).  Every reference is ``"module:function"``.
    """

    name: str
    generate: str
    scorer: str | None
    chance_floor: str
    params: type[TaskParams] = TaskParams
    kind: ItemKind = "generate"
    shortcuts: str | None = None
    count_items: str | None = None
    fidelity_only: bool = False  # generated answers with no reference: judged by fidelity to the baseline
    #: New tokens an item may take when the spec sets no ``max_new_tokens``; None where the item decides it
    #: (an answer's length, the hops of a chain): validation then counts at least one.
    default_new_tokens: int | None = None
    target_lengths: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.params, type) and issubclass(self.params, TaskParams)):
            raise ValueError(f"task {self.name!r}: params must be a TaskParams model, not {self.params!r}")
        if clash := sorted(COMMON_FIELDS & set(self.params.model_fields)):
            raise ValueError(f"task {self.name!r}: {clash} are every task's fields, not parameters of its own")
        if (self.scorer is None) != (self.kind == "perplexity" or self.fidelity_only):
            raise ValueError(f"task {self.name!r}: perplexity items and fidelity-only tasks, and only they, "
                             "have no scorer")
        refs = [ref for ref in (self.generate, self.scorer, self.shortcuts, self.count_items) if ref is not None]
        if malformed := [ref for ref in refs if ref.count(":") != 1]:
            raise ValueError(f"task {self.name!r}: {malformed} are not 'module:function' references")

    @property
    def reads_file(self) -> bool:
        """Its items come from the file at its ``path`` (:class:`FileParams`), not from a generator's prose."""
        return issubclass(self.params, FileParams)

    @property
    def needle_depths(self) -> bool:
        """Its items hide what they ask for at one of its ``depths`` (:class:`NeedleParams`; ``item.depth``)."""
        return issubclass(self.params, NeedleParams)

    def parse_params(self, table: dict[str, Any], stored: bool = False) -> TaskParams:
        """``table`` (a task table without its common fields) validated against :attr:`params`.  A key the
        model lacks, or a required one missing, is a :class:`~kvlab.core.limits.FieldProblem` at that key that
        names the task's parameters; an older kvlab's key is dropped at its old default, or at any value from
        the store (``stored``; :data:`LEGACY_DEFAULTS`)."""
        fields = self.params.model_fields
        table = {key: value for key, value in table.items()
                 if key in fields or key not in LEGACY_DEFAULTS or (value != LEGACY_DEFAULTS[key] and not stored)}
        if unknown := [key for key in table if key not in fields]:
            also = f"; nor does it take {', '.join(map(repr, unknown[1:]))}" if unknown[1:] else ""
            raise FieldProblem(unknown[0], self._unknown(unknown[0]) + also)
        for key, field in fields.items():
            if field.is_required() and table.get(key) is None:
                raise FieldProblem(key, f"the {self.name} task needs `{key}`: {field.description}")
        return self.params.model_validate(table)

    def _unknown(self, key: str) -> str:
        own = list(self.params.model_fields)
        common = [name for name in TaskSpec.model_fields if name in COMMON_FIELDS and name != "name"]
        text = (f"the {self.name} task has no parameter {key!r} (its own: {', '.join(own) or 'none'}; "
                f"every task's: {', '.join(common)})")
        takers = [name for name, task in TASKS.items() if key in task.params.model_fields]
        if takers:
            return (f"{text}; {key} is a parameter of {' and '.join(takers)}: remove it, or set name = "
                    f"{' or '.join(map(repr, takers))}")
        if close := difflib.get_close_matches(key, [*own, *common], n=1):
            return f"{text}; did you mean {close[0]!r}?"
        return text


# --- the tasks: each one's parameters, then its entry --------------------------------------------------
#
# A task's parameter model is declared here, beside its entry, rather than in its module under kvlab/tasks:
# validating a spec happens in this bottom layer (the CLI before any heavy import, the dashboard, the store's
# readers), which imports no other kvlab package, lazily or not (tests/test_no_import_cycle.py), so it cannot
# reach a model that lives in a task's module.  A model is data (names, bounds, labels), like the rest of an
# entry; the module is the task's behaviour.  A task added from outside kvlab (tests/tasks/test_task_registry.py)
# declares its model in its own module and names the class in its entry.


class PasskeyParams(NeedleParams):
    """passkey: a random 5-digit key hidden at one of ``depths``."""


class MultikeyParams(SharedContextParams, NeedleParams):
    """multikey: ``num_pairs`` key-value pairs, the queried one at one of ``depths``."""

    num_pairs: int = Field(default=4, ge=2, le=1000, title="Key-value pairs",
                           description="Key-value pairs in the context (each question asks for one of them).")

    @model_validator(mode="after")
    def _check_keys(self) -> Self:
        if self.questions_per_context > self.num_pairs:
            raise FieldProblem("questions_per_context", f"{self.questions_per_context} questions need as many keys; "
                                                        f"num_pairs = {self.num_pairs}")
        return self


class VariableTrackingParams(TaskParams):
    """variable_tracking: chains of assignments, the first asked for."""

    num_chains: int = Field(default=4, ge=1, le=100, title="Chains",
                            description="Chains of assignments (the first is asked for, the rest distract).")
    num_hops: int = Field(default=4, ge=1, le=100, title="Hops per chain", description="Assignments per chain.")


class RecallParams(NeedleParams):
    """recall: a passage of adjective-noun pairs to reproduce."""

    passage_words: int = Field(
        default=48, ge=8, le=2000, multiple_of=2, title="Passage words",
        description="Words of the passage to reproduce (adjective-noun pairs; the first two pairs are given). "
        "The answer's generation budget grows with it.")


class PerplexityParams(TaskParams):
    """perplexity: the likelihood of a held-out continuation."""

    continuation_tokens: int = Field(default=64, ge=8, le=8192, title="Continuation tokens",
                                     description="Length in tokens of the held-out continuation whose likelihood "
                                     "is measured.")


class JsonlParams(FileParams, SharedContextParams):
    """jsonl: the rows of the user's file, each answer scored by its answer scorer."""

    scorer: str | None = Field(
        default=None, title="Answer scorer",
        description=f"How each row's answer is scored unless the row names its own `scorer`; unset: "
        f"{DEFAULT_ANSWER_SCORER}. " + "; ".join(f"{s.name}: {s.help}" for s in ANSWER_SCORERS.values()),
        json_schema_extra={"enum": list(ANSWER_SCORERS)})

    @field_validator("scorer")
    @classmethod
    def _check_scorer(cls, scorer: str | None) -> str | None:
        return None if scorer is None else check_answer_scorer(scorer)


_FIRST_NUMBER = "kvlab.tasks.scoring:first_number"

TASKS: dict[str, Task] = {t.name: t for t in (
    # " 71432." is 6-7 tokens in digit-splitting tokenizers
    Task("passkey", "kvlab.tasks.passkey:generate", scorer=_FIRST_NUMBER, params=PasskeyParams,
         default_new_tokens=10,
         chance_floor="about 0 (a random 5-digit key)"),
    Task("multikey", "kvlab.tasks.multikey:generate", scorer=_FIRST_NUMBER, params=MultikeyParams,
         chance_floor="1/num_pairs (any one number of the context)",
         default_new_tokens=12,  # " 1234567." is 8-9 tokens in digit-splitting tokenizers
         shortcuts="kvlab.tasks.multikey:shortcut_scores"),
    Task("variable_tracking", "kvlab.tasks.variable_tracking:generate", scorer="kvlab.tasks.scoring:variable_names",
         params=VariableTrackingParams,
         chance_floor="2/(num_chains+1) F1 (every variable of the context)",
         shortcuts="kvlab.tasks.variable_tracking:shortcut_scores"),
    Task("recall", "kvlab.tasks.recall:generate", scorer="kvlab.tasks.recall:score", params=RecallParams,
         chance_floor="about 15% at 48 words (a list of the vocabulary in its own order, in pairs as the passage)",
         shortcuts="kvlab.tasks.recall:shortcut_scores"),
    Task("story", "kvlab.tasks.story:generate", scorer=None, fidelity_only=True,
         default_new_tokens=256,
         chance_floor="none: no score, judged by fidelity to the baseline's continuation"),
    Task("perplexity", "kvlab.tasks.perplexity:generate", scorer=None, kind="perplexity", params=PerplexityParams,
         chance_floor="none (not a 0-1 score)"),
    Task("jsonl", "kvlab.tasks.jsonl:generate", scorer="kvlab.tasks.scoring:user_answer", params=JsonlParams,
         chance_floor="depends on the file", default_new_tokens=32, target_lengths=False,
         count_items="kvlab.tasks.jsonl:planned_items"),
)}


def generated_tasks() -> tuple[str, ...]:
    """Tasks whose items are generated one at a time to a length (the playground's and ``kvlab serve``'s):
    neither a perplexity task nor one that reads the user's file.  Read from the registry when called, so that
    a task registered later (a test's) is one of them."""
    return tuple(name for name, task in TASKS.items() if task.kind != "perplexity" and not task.reads_file)
#: The task that runs the rows of the user's JSONL file.
FILE_TASK: str = next(name for name, task in TASKS.items() if task.reads_file)


def task_new_tokens(task: str) -> int:
    """``default_new_tokens`` of a task that has one (the generators of fixed-length answers)."""
    tokens = TASKS[task].default_new_tokens
    assert tokens is not None, f"task {task!r} has no default_new_tokens"
    return tokens


def chance_floor_text(task: str) -> str:
    """What answering ``task`` without doing it scores, in words ("-" for a task not registered,
    e.g. one of stored results that this version no longer has)."""
    entry = TASKS.get(task)
    return entry.chance_floor if entry is not None else "-"
