"""TaskItem: one prompt with its expected answer, engine-agnostic (every engine reads it; the task generators
of :mod:`kvlab.tasks` make it)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from kvlab.core.tasks import ItemKind


@dataclass(frozen=True)
class TaskItem:
    """One test item.

    The prompt is ``context + question``, concatenated verbatim (no separator is added).
    The KV cache of ``context`` is what an experiment compresses; ``question`` is fed
    after compression and ends with the answer prefix, so a completion model answers
    directly. For ``kind == "perplexity"``, ``question`` is empty and the engine measures
    the likelihood of ``continuation``, appended verbatim after the prompt.

    ``context_length`` is the target prompt length in tokens (for jsonl, the measured
    one); ``metadata["prompt_tokens"]`` holds the measured
    ``tokens(context) + tokens(question)``, each tokenized without special tokens.
    """

    task: str
    item_id: str
    context: str
    question: str
    answer: str
    context_length: int
    depth: float | None
    max_new_tokens: int
    kind: ItemKind = "generate"
    continuation: str = ""
    stop: tuple[str, ...] = ()  # generation ends once the output contains one of these (as servers' `stop`)
    #: Items with one ``context_id`` share their context: an engine that can prefills and compresses it once
    #: and answers their questions in ``question_rank`` order from that cache (``multi_turn``: in one
    #: conversation, each question after the previous answer).
    context_id: str | None = None
    question_rank: int = 0
    multi_turn: bool = False
    metadata: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def prompt(self) -> str:
        """The full text a completion model is given."""
        return self.context + self.question

    @property
    def content_hash(self) -> str:
        """16 hex digits of SHA-256 over what the item is (its task, text and expected answer): two items are
        the same item only when this is equal, whatever their ids (the same id names another item under
        another seed).  Stored with each result (``extra["item_hash"]``) to pair results across experiments."""
        content = [self.task, self.kind, self.context, self.question, self.continuation, self.answer]
        return hashlib.sha256(json.dumps(content).encode()).hexdigest()[:16]
