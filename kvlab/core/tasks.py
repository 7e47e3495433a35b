"""The task registry and TaskSpec: which tasks exist, what each reads, and which items to generate.

An entry (:class:`Task`) names the task's generator, its scorer, its known shortcuts and its item
counter as ``"module:function"`` references, in the manner of Python's entry points: this module
is pure data, so that validating a spec imports no task code, and :mod:`kvlab.tasks.registry`
resolves the references when items are made or scored.  Beside them an entry gives the chance
floor, the ``TaskSpec`` fields the task reads and the kind of its items (which fixes their prompt
layout).  TaskSpec validation and its messages, item generation and counting, the scorer dispatch,
the report's chance floors, the length buckets of a file's items and the needle heatmap read from
here.  Adding a task is one module (its generator, and its scorer if none of
:mod:`kvlab.tasks.scoring` fits) plus one entry in :data:`TASKS`; ``tests/tasks/test_task_registry.py``
shows that nothing else is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

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


class TaskSpec(BaseModel):
    """What to generate: one task, at one or more prompt lengths.

    ``name`` is one of the task registry's (:data:`TASKS`), checked against
    it when validated.  Fields that a task does not use are ignored by it (``num_pairs`` for
    passkey, ...), except ``path``, which only a task that reads a file (``jsonl``) accepts, so
    that a typo in the task name cannot silently turn a user's file into a synthetic task, and
    ``scorer``, which only a task scored by :data:`ANSWER_SCORERS` accepts.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The task: one of the task registry's names.",
                      json_schema_extra=lambda schema: schema.update(enum=list(TASKS)))
    context_lengths: list[int] = Field(
        default=[1024],
        min_length=1,
        description="Target prompt lengths (context + question) in tokens of the model's "
        f"tokenizer, each in {MIN_CONTEXT_LENGTH}..{MAX_CONTEXT_LENGTH}. Ignored by jsonl.",
    )
    depths: list[float] = Field(
        default=[0.1, 0.5, 0.9],
        min_length=1,
        description="Needle depths as a fraction of the context, each in [0, 1] "
        "(passkey; multikey: depth of the queried pair).",
    )
    num_items: int | None = Field(
        default=None,
        ge=1,
        description=f"Items per context length; unset: {DEFAULT_NUM_ITEMS}. jsonl: at most this many "
        "lines of the file; unset: the whole file.",
    )
    num_pairs: int = Field(default=4, ge=2, le=1000, description="multikey: key-value pairs.")
    num_chains: int = Field(default=4, ge=1, le=100,
                            description="variable_tracking: chains (the first is asked for, the rest distract).")
    num_hops: int = Field(default=4, ge=1, le=100, description="variable_tracking: hops per chain.")
    continuation_tokens: int = Field(
        default=64, ge=8, le=8192, description="perplexity: held-out continuation length in tokens."
    )
    passage_words: int = Field(
        default=48, ge=8, le=2000, multiple_of=2,
        description="recall: words of the passage to reproduce (adjective-noun pairs; the first two pairs are "
        "given). The answer's generation budget grows with it.")
    questions_per_context: int = Field(
        default=1, ge=1, le=64,
        description="multikey: questions asked of each context (different keys), jsonl: most rows sharing a "
        "`context_id`; above 1 the context is prefilled and compressed once, query-agnostically, and every "
        "question answered from that same cache (num_items counts contexts).")
    multi_turn: bool = Field(
        default=False,
        description="With questions_per_context above 1: each question follows the previous answer in one "
        "conversation (else each starts from the compressed context).")
    path: str | None = Field(
        default=None,
        description="jsonl: path of the JSONL file (required); relative paths are relative to the current "
        "directory (CLI) or the data directory KVLAB_DATA_DIR (dashboard).",
    )
    max_new_tokens: int | None = Field(
        default=None, ge=1, le=4096, description="Generation budget; default depends on the task."
    )
    scorer: str | None = Field(
        default=None,
        description=f"jsonl: how answers are scored, one of {', '.join(ANSWER_SCORERS)}; a row's own `scorer` "
        f"key wins; unset: {DEFAULT_ANSWER_SCORER}.",
        json_schema_extra=lambda schema: schema.update(enum=list(ANSWER_SCORERS)))

    @property
    def items_per_length(self) -> int:
        """Items per context length of a generated task (``num_items``, else the default).

        "Unset" is ``None``, never pydantic's ``model_fields_set``: a spec crosses the store as
        JSON, and the round trip marks every default as set.
        """
        return DEFAULT_NUM_ITEMS if self.num_items is None else self.num_items

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

    @field_validator("depths")
    @classmethod
    def _check_depths(cls, depths: list[float]) -> list[float]:
        bad = [d for d in depths if not 0.0 <= d <= 1.0]
        if bad:
            raise ValueError(f"each depth must be a fraction in [0, 1], got {bad}")
        if len(set(depths)) != len(depths):
            raise ValueError(f"depths must be distinct, got {depths}")
        return depths

    @field_validator("scorer")
    @classmethod
    def _check_scorer(cls, scorer: str | None) -> str | None:
        return None if scorer is None else check_answer_scorer(scorer)

    @field_validator("path")
    @classmethod
    def _check_path_text(cls, path: str | None) -> str | None:
        if path is not None and (len(path) > MAX_PATH_CHARS or not path.isprintable()):
            raise ValueError(f"give a file path of at most {MAX_PATH_CHARS} printable characters "
                             "(no newline, tab or NUL)")
        return path

    @model_validator(mode="after")
    def _check_path(self) -> TaskSpec:
        reads_file = TASKS[self.name].reads_file
        if reads_file and not self.path:
            raise ValueError(
                f"path: the {self.name} task needs `path` = a JSONL file with one "
                '{"context": ..., "question": ..., "answer": ...} object per line'
            )
        if not reads_file and self.path is not None:
            readers = [name for name, task in TASKS.items() if task.reads_file]
            raise ValueError(
                f"path: only the {' or '.join(readers)} task reads a file; remove `path` or set name = "
                f"{' or '.join(map(repr, readers))} (got name = {self.name!r})"
            )
        shares = "questions_per_context" in TASKS[self.name].fields
        if (self.questions_per_context > 1 or self.multi_turn) and not shares:
            sharing = [name for name, task in TASKS.items() if "questions_per_context" in task.fields]
            raise ValueError(f"questions_per_context: the {self.name} task asks one question of each context; "
                             f"several questions of one context are asked by {' and '.join(sharing)}")
        if self.multi_turn and self.questions_per_context == 1:
            raise ValueError("multi_turn: a conversation needs questions_per_context above 1")
        bound = TASKS[self.name].questions_bound
        if bound is not None and self.questions_per_context > getattr(self, bound):
            raise ValueError(f"questions_per_context: {self.questions_per_context} questions need as many keys; "
                             f"{bound} = {getattr(self, bound)}")
        if self.scorer is not None and "scorer" not in TASKS[self.name].fields:
            scored = [name for name, task in TASKS.items() if "scorer" in task.fields]
            raise ValueError(f"scorer: only the {' or '.join(scored)} task takes a scorer (the {self.name} task "
                             "scores its own answers); remove it")
        return self



#: The ``TaskSpec`` fields every task may read (``name`` aside).
SPEC_FIELDS = frozenset(TaskSpec.model_fields) - {"name"}


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
    question: query-aware configs run query-agnostic).  ``fields``: the ``TaskSpec`` fields it
    reads (the form shows only these; ``path`` marks a task whose items come from the user's
    file).  ``chance_floor``: what answering without doing the task scores (the task module's
    docstring says why); ``shortcuts`` names ``(item) -> {shortcut: score}``, which measures the
    known ways of doing so on each item.  ``fidelity_only``: its generated answers have no reference,
    so no score; its configs are judged by fidelity to the baseline alone.  ``count_items`` names
    ``(spec) -> int | None``, how many items ``spec`` makes counted without a tokenizer (None when
    that cannot be told here); unset: ``num_items`` per context length.  Every reference is
    ``"module:function"``.
    """

    name: str
    generate: str
    scorer: str | None
    chance_floor: str
    fields: frozenset[str]
    kind: ItemKind = "generate"
    shortcuts: str | None = None
    count_items: str | None = None
    fidelity_only: bool = False  # generated answers with no reference: judged by fidelity to the baseline
    #: New tokens an item may take when the spec sets no ``max_new_tokens``; None where the item decides it
    #: (an answer's length, the hops of a chain): validation then counts at least one.
    default_new_tokens: int | None = None
    #: The parameter that bounds ``questions_per_context`` (each question asks for a different one of them).
    questions_bound: str | None = None

    def __post_init__(self) -> None:
        unknown = sorted((self.fields | ({self.questions_bound} if self.questions_bound else set())) - SPEC_FIELDS)
        if unknown:
            raise ValueError(f"task {self.name!r}: {unknown} are not TaskSpec fields")
        if (self.scorer is None) != (self.kind == "perplexity" or self.fidelity_only):
            raise ValueError(f"task {self.name!r}: perplexity items and fidelity-only tasks, and only they, "
                             "have no scorer")
        refs = [ref for ref in (self.generate, self.scorer, self.shortcuts, self.count_items) if ref is not None]
        if malformed := [ref for ref in refs if ref.count(":") != 1]:
            raise ValueError(f"task {self.name!r}: {malformed} are not 'module:function' references")

    @property
    def reads_file(self) -> bool:
        """Its items come from the file at ``path``, not from a generator's prose."""
        return "path" in self.fields

    @property
    def target_lengths(self) -> bool:
        """Its items are made to the spec's ``context_lengths`` (else their lengths are measured)."""
        return "context_lengths" in self.fields

    @property
    def needle_depths(self) -> bool:
        """Its items hide what they ask for at one of the spec's ``depths`` (``item.depth``)."""
        return "depths" in self.fields


#: What a task reads whose items are made to the spec's context lengths and answered in new tokens.
_GENERATED = frozenset({"context_lengths", "num_items", "max_new_tokens"})
_FIRST_NUMBER = "kvlab.tasks.scoring:first_number"

TASKS: dict[str, Task] = {t.name: t for t in (
    # " 71432." is 6-7 tokens in digit-splitting tokenizers
    Task("passkey", "kvlab.tasks.passkey:generate", scorer=_FIRST_NUMBER, fields=_GENERATED | {"depths"},
         default_new_tokens=10,
         chance_floor="about 0 (a random 5-digit key)"),
    Task("multikey", "kvlab.tasks.multikey:generate", scorer=_FIRST_NUMBER,
         fields=_GENERATED | {"depths", "num_pairs", "questions_per_context", "multi_turn"},
         chance_floor="1/num_pairs (any one number of the context)",
         default_new_tokens=12,  # " 1234567." is 8-9 tokens in digit-splitting tokenizers
         shortcuts="kvlab.tasks.multikey:shortcut_scores", questions_bound="num_pairs"),
    Task("variable_tracking", "kvlab.tasks.variable_tracking:generate", scorer="kvlab.tasks.scoring:variable_names",
         fields=_GENERATED | {"num_chains", "num_hops"},
         chance_floor="2/(num_chains+1) F1 (every variable of the context)",
         shortcuts="kvlab.tasks.variable_tracking:shortcut_scores"),
    Task("recall", "kvlab.tasks.recall:generate", scorer="kvlab.tasks.recall:score",
         fields=_GENERATED | {"depths", "passage_words"},
         chance_floor="about 15% at 48 words (a list of the vocabulary in its own order, in pairs as the passage)",
         shortcuts="kvlab.tasks.recall:shortcut_scores"),
    Task("story", "kvlab.tasks.story:generate", scorer=None, fidelity_only=True, fields=_GENERATED,
         default_new_tokens=256,
         chance_floor="none: no score, judged by fidelity to the baseline's continuation"),
    Task("perplexity", "kvlab.tasks.perplexity:generate", scorer=None, kind="perplexity",
         fields=frozenset({"context_lengths", "num_items", "continuation_tokens"}),
         chance_floor="none (not a 0-1 score)"),
    Task("jsonl", "kvlab.tasks.jsonl:generate", scorer="kvlab.tasks.scoring:user_answer",
         fields=frozenset({"path", "num_items", "max_new_tokens", "scorer", "questions_per_context", "multi_turn"}),
         chance_floor="depends on the file", default_new_tokens=32,
         count_items="kvlab.tasks.jsonl:planned_items"),
)}


#: Tasks whose items are generated one at a time to a length (the playground's and ``kvlab serve``'s): neither
#: a perplexity task nor one that reads the user's file.
GENERATED_TASKS: tuple[str, ...] = tuple(name for name, task in TASKS.items()
                                         if task.kind != "perplexity" and not task.reads_file)
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
