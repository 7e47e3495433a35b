"""The playground's session on the embedded engine: the modes its runs switch on, and the prefill it keeps.

An experiment runs with every mode off (:class:`SessionModes`' defaults), so that its runs stay comparable; a run of
``POST /kvlab/playground`` switches them on for its duration
(:meth:`~kvlab.engines.embedded.EmbeddedEngine.session`), and the engine holds one prefill from one run to the next
(:class:`HeldPrefill`), so that a user who runs the same item again waits for no prefill.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

#: What the engine prefills (its keys and values, every scorer's scores, the time it took).
Prefill = TypeVar("Prefill")


@dataclass(frozen=True)
class SessionModes:
    """How the embedded engine departs from an experiment's way of running an item; all off by default."""

    report_positions: bool = False
    """Whether each result's ``extra["kept_positions"]`` says which prompt positions each head kept
    (:class:`~kvlab.core.results.KeptPositions`: a token map's data, about 15 KB at 1K tokens, so off in
    experiments)."""

    share_prefill: bool = False
    """Whether an item's query-agnostic configs may read the query-aware prefill's cache up to the context's end
    instead of running a prefill of their own, where they need no prefill scores (the playground: one prefill
    instead of two).  Off in experiments, whose runs stay comparable: the longer prefill rounds the context's keys
    and values a little differently (2.4e-5 at most in float32, measured at 0.5-2K tokens) and its time, charged to
    both layouts, covers the question's tokens too."""

    reuse_prefill: bool = False
    """Whether a prefill of the same tokens for the same scorers as the last one reuses it (the playground: a user
    who changes the configs and runs again waits for no prefill).  The engine never modifies a prefill's tensors
    (every config compresses from the one prefill: :func:`kvlab.compress.cache.build_compressed_cache`), so the
    configs give the same answers, kept tokens and bytes as from a fresh one (``tests/serve/test_playground_runs.py``);
    its time is charged as it was measured.  One prefill is held (:class:`HeldPrefill`; at 1K tokens of
    SmolLM2-135M, 47 MB of keys and values), dropped before another is computed and by any prefill while this is
    off."""

    decode_threads: int | None = None
    """torch threads while compressing and decoding (None: the prefill's).  The playground uses one where OpenMP
    threads sleep when idle (:func:`kvlab.threads.threads_sleep`): a decode step is hundreds of small kernels, and
    waking a sleeping thread for each cost more than it gave.  Decoding a 1K-token passkey's five answers on 2 cores:
    2.5 s on one thread, 3.1 s on two (idle); 2.5 s and 3.0 s beside a worker."""


class HeldPrefill(Generic[Prefill]):
    """The one prefill kept for the next run (:attr:`SessionModes.reuse_prefill`), with the key it was computed
    for (the prefix's tokens, its scorers, whether it kept the hidden states)."""

    def __init__(self) -> None:
        self.held: tuple[Hashable, Prefill] | None = None

    def get(self, key: Hashable, compute: Callable[[], Prefill], reuse: bool) -> Prefill:
        """The prefill for ``key``: the held one where ``reuse`` is on and it was computed for ``key``, else
        ``compute()``'s, held for the next run only where ``reuse`` is on.  The held one is freed before
        another is computed."""
        if reuse and self.held is not None and self.held[0] == key:
            return self.held[1]
        self.held = None
        prefill = compute()
        if reuse:
            self.held = (key, prefill)
        return prefill
