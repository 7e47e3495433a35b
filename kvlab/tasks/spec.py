"""TaskSpec: which task items to generate, validated before any work starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

if TYPE_CHECKING:
    from kvlab.tasks.registry import Task

MIN_CONTEXT_LENGTH = 128
MAX_CONTEXT_LENGTH = 131072
MAX_PATH_CHARS = 4096
#: Items per context length of a generated task whose spec does not say.
DEFAULT_NUM_ITEMS = 10


class TaskSpec(BaseModel):
    """What to generate: one task, at one or more prompt lengths.

    ``name`` is one of the task registry's (:data:`kvlab.tasks.registry.TASKS`), checked against
    it when validated.  Fields that a task does not use are ignored by it (``num_pairs`` for
    passkey, ...), except ``path``, which only a task that reads a file (``jsonl``) accepts, so
    that a typo in the task name cannot silently turn a user's file into a synthetic task.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The task: one of the task registry's names.",
                      json_schema_extra=lambda schema: schema.update(enum=list(_tasks())))
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
    path: str | None = Field(
        default=None,
        description="jsonl: path of the JSONL file (required); relative paths are relative to the current "
        "directory (CLI) or the data directory KVLAB_DATA_DIR (dashboard).",
    )
    max_new_tokens: int | None = Field(
        default=None, ge=1, le=4096, description="Generation budget; default depends on the task."
    )

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
        if name not in _tasks():
            raise ValueError(f"unknown task {name!r}; known: {', '.join(_tasks())}")
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

    @field_validator("path")
    @classmethod
    def _check_path_text(cls, path: str | None) -> str | None:
        if path is not None and (len(path) > MAX_PATH_CHARS or not path.isprintable()):
            raise ValueError(f"give a file path of at most {MAX_PATH_CHARS} printable characters "
                             "(no newline, tab or NUL)")
        return path

    @model_validator(mode="after")
    def _check_path(self) -> TaskSpec:
        reads_file = _tasks()[self.name].reads_file
        if reads_file and not self.path:
            raise ValueError(
                f"path: the {self.name} task needs `path` = a JSONL file with one "
                '{"context": ..., "question": ..., "answer": ...} object per line'
            )
        if not reads_file and self.path is not None:
            readers = [name for name, task in _tasks().items() if task.reads_file]
            raise ValueError(
                f"path: only the {' or '.join(readers)} task reads a file; remove `path` or set name = "
                f"{' or '.join(map(repr, readers))} (got name = {self.name!r})"
            )
        return self


def _tasks() -> dict[str, Task]:
    """The task registry (:data:`kvlab.tasks.registry.TASKS`), imported when first needed: it
    imports the task modules, which import this one."""
    from kvlab.tasks.registry import TASKS

    return TASKS
