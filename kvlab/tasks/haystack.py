"""Haystack prose, needle insertion, and fitting a prompt to a token budget.

The haystack is ``data/haystack.txt`` (see ``data/README.txt`` for its source). It is
read as one stream of words with sentence boundaries marked; a context is a window of
that stream starting at a sentence, wrapping around at the end (so a context longer
than the text, ~60k tokens, repeats it). Needles go between sentences, never inside one.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

HAYSTACK_FILE = Path(__file__).parent / "data" / "haystack.txt"

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"'])\s+")


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the generators use."""

    def __call__(self, text: str, add_special_tokens: bool = ...) -> Mapping[str, Any]: ...


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    """Tokens in ``text`` without BOS/EOS, as an engine prefilling it would see them."""
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass(frozen=True, eq=False)
class Haystack:
    """The haystack as a flat word stream; ``sentence_starts`` are word indices."""

    words: tuple[str, ...]
    sentence_starts: tuple[int, ...]
    _start_set: frozenset[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_start_set", frozenset(self.sentence_starts))

    def random_start(self, rng: random.Random) -> int:
        return rng.choice(self.sentence_starts)

    def window(self, start: int, n_words: int) -> list[str]:
        """``n_words`` words from ``start``, wrapping around at the end of the text."""
        total = len(self.words)
        return [self.words[(start + i) % total] for i in range(n_words)]

    def boundaries(self, start: int, n_words: int) -> list[int]:
        """Offsets within the window at which a sentence starts, plus its end ``n_words``."""
        total = len(self.words)
        inner = [i for i in range(1, n_words) if (start + i) % total in self._start_set]
        return [0, *inner, n_words]


@lru_cache(maxsize=1)
def load_haystack(path: Path = HAYSTACK_FILE) -> Haystack:
    """Parse the haystack file: paragraphs separated by blank lines, split into sentences."""
    words: list[str] = []
    starts: list[int] = []
    for paragraph in path.read_text(encoding="utf-8").split("\n\n"):
        for sentence in _SENTENCE_SPLIT.split(paragraph.strip()):
            sentence_words = sentence.split()
            if sentence_words:
                starts.append(len(words))
                words.extend(sentence_words)
    return Haystack(tuple(words), tuple(starts))


@dataclass(frozen=True)
class Needle:
    """A sentence to hide at ``depth``: the fraction of haystack words placed before it."""

    text: str
    depth: float


def render_context(
    haystack: Haystack,
    prefix: str,
    start: int,
    n_words: int,
    needles: Sequence[Needle] = (),
) -> str:
    """``prefix`` + ``n_words`` haystack words with each needle at the nearest sentence break.

    Needles sharing a break keep their order in ``needles``.
    """
    words = haystack.window(start, n_words)
    breaks = haystack.boundaries(start, n_words)
    inserts: dict[int, list[str]] = {}
    for needle in needles:
        at = min(breaks, key=lambda b: abs(b - needle.depth * n_words))
        inserts.setdefault(at, []).append(needle.text)
    pieces: list[str] = []
    for i in range(n_words + 1):
        pieces.extend(inserts.get(i, ()))
        if i < n_words:
            pieces.append(words[i])
    return prefix + " ".join(pieces)


@dataclass(frozen=True)
class Fitted:
    """A context fitted to a budget, with its measured token counts."""

    context: str
    n_words: int
    context_tokens: int
    question_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return self.context_tokens + self.question_tokens


class ContextTooShortError(ValueError):
    """The fixed parts of a prompt alone exceed the requested length."""


def fit_to_length(
    tokenizer: Tokenizer, target_tokens: int, question: str, build: Callable[[int], str]
) -> Fitted:
    """Largest ``n`` such that ``tokens(build(n)) + tokens(question) <= target_tokens``.

    ``build(n)`` renders a context with ``n`` haystack words; word granularity puts the
    result within a couple of tokens of the target. Token counts grow monotonically with
    ``n`` up to boundary effects of a token or so, which a binary search tolerates.
    """
    question_tokens = count_tokens(tokenizer, question)

    def measure(n: int) -> tuple[str, int]:
        text = build(n)
        return text, count_tokens(tokenizer, text)

    best = (0, *measure(0))
    if best[2] + question_tokens > target_tokens:
        raise ContextTooShortError(
            f"{target_tokens} tokens is too short: the instructions, needles and question "
            f"alone take {best[2] + question_tokens} tokens"
        )
    lo, hi = 0, max(1, target_tokens - best[2] - question_tokens)
    while True:  # grow hi until it overshoots
        text, tokens = measure(hi)
        if tokens + question_tokens > target_tokens:
            break
        best, lo, hi = (hi, text, tokens), hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        text, tokens = measure(mid)
        if tokens + question_tokens <= target_tokens:
            best, lo = (mid, text, tokens), mid
        else:
            hi = mid
    n_words, context, context_tokens = best
    return Fitted(context, n_words, context_tokens, question_tokens)


def token_depth(tokenizer: Tokenizer, context: str, needle: str) -> float:
    """Where ``needle`` starts in ``context``, as a fraction of the context's tokens."""
    index = context.index(needle)
    return count_tokens(tokenizer, context[:index]) / count_tokens(tokenizer, context)


@dataclass(frozen=True)
class ItemSlot:
    """One item to build: its length, its index within that length, its needle depth (round-robin
    over the spec's depths, or None for tasks without one), its id and its private generator."""

    task: str
    length: int
    index: int
    depth: float | None
    item_id: str
    rng: random.Random

    @property
    def needle_depth(self) -> float:
        """``depth`` of a slot made with depths (a needle task's: the spec holds one at least)."""
        assert self.depth is not None, f"{self.item_id}: no needle depth"
        return self.depth


def item_slots(task: str, context_lengths: Sequence[int], num_items: int, seed: int,
               depths: Sequence[float] | None = None) -> list[ItemSlot]:
    """``num_items`` slots per context length, ids ``task/L<length>[/d<depth>]/i<index>``."""
    from kvlab.tasks.items import depth_label, item_rng

    slots = []
    for length in context_lengths:
        for index in range(num_items):
            depth = depths[index % len(depths)] if depths else None
            item_id = f"{task}/L{length}" + (f"/d{depth_label(depth)}" if depth is not None else "") + f"/i{index}"
            slots.append(ItemSlot(task, length, index, depth, item_id, item_rng(seed, item_id)))
    return slots


@dataclass(frozen=True)
class HaystackPrompt:
    """A filled slot: the context's haystack window with ``needles`` in it, ``fitted`` to the slot's
    length together with ``question``; ``start`` is where the window begins in the haystack."""

    fitted: Fitted
    start: int

    def metadata(self, **more: Any) -> dict[str, Any]:
        return {"prompt_tokens": self.fitted.prompt_tokens, "haystack_start": self.start, **more}


def haystack_prompt(slot: ItemSlot, tokenizer: Tokenizer, prefix: str, question: str,
                    needles: Sequence[Needle] = ()) -> HaystackPrompt:
    """The skeleton every haystack task shares: a window of prose from a random sentence (drawn
    from the slot's generator after the task's own draws), needles placed in it, fitted to the
    slot's length with the question."""
    haystack = load_haystack()
    start = haystack.random_start(slot.rng)
    fitted = fit_to_length(tokenizer, slot.length, question,
                           lambda n: render_context(haystack, prefix, start, n, needles=needles))
    return HaystackPrompt(fitted, start)
