"""A served request's sampling and its prompt's log-probabilities (what the sampled fidelity estimator needs).

:class:`Sampling` picks each next token: greedy at temperature 0, else a draw from ``softmax(logits / T)``
with the request's own ``torch.Generator`` seeded by its ``seed`` (the same seed, the same tokens).

:class:`PromptScorer` collects, from the logits of the passes that read a prompt, what vLLM's
``prompt_logprobs`` holds for each prompt token after the first: its log-probability (float32
``log_softmax``), its rank (vLLM's: how many tokens score at least as high, so 1 for the argmax) and the
top ``k`` tokens with theirs (``vllm/v1/sample/sampler.py`` ``gather_logprobs``).  The logits come in
pieces (the prefill's positions, the tokens fed after compression, the teacher-forced tail), each reduced
as it comes, so no ``[tokens, vocab]`` tensor of the whole prompt is ever held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Sampling:
    """How the next token is picked: greedy at ``temperature`` 0, else sampled at that temperature from a
    generator seeded with ``seed`` (None: a seed of the generator's choosing, as OpenAI and vLLM do)."""

    temperature: float = 0.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def picker(self, device: torch.device) -> Callable[[torch.Tensor], int]:
        """A function from one position's logits to the next token id (its own generator: one per request)."""
        if self.greedy:
            return lambda logits: int(logits.argmax())
        generator = torch.Generator(device=device)
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed % 2**64)  # vLLM's seeds are signed 64-bit; torch takes them modulo 2^64
        temperature = self.temperature

        def pick(logits: torch.Tensor) -> int:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            return int(torch.multinomial(probs, 1, generator=generator))

        return pick


GREEDY = Sampling()


@dataclass(frozen=True)
class PromptScores:
    """Per prompt token from :attr:`PromptScorer.first` on (index ``i`` is token ``first + i``): its
    log-probability, its rank, and the top tokens' ids and log-probabilities, best first.  ``rows``: their full
    log-probability rows (``[tokens, vocab]``, float32), when asked."""

    token_logprobs: list[float]
    ranks: list[int]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]
    rows: torch.Tensor | None = None


class PromptScorer:
    """Collects :class:`PromptScores` of the prompt ``ids`` from logits given in any pieces, in order: of its
    tokens from ``first`` on (1: all that have a prediction), with ``top`` tokens per position, and their full
    rows when ``rows``."""

    def __init__(self, ids: Sequence[int], top: int, first: int = 1, rows: bool = False):
        if not 1 <= first <= len(ids):
            raise ValueError(f"no prompt token {first} to score from (the prompt has {len(ids)})")
        self.ids = torch.tensor(list(ids), dtype=torch.long)
        self.top = top
        self.first = first
        self.rows = rows
        self._next = first  # the next token to score
        self._token: list[float] = []
        self._ranks: list[int] = []
        self._top_ids: list[list[int]] = []
        self._top_logprobs: list[list[float]] = []
        self._rows: list[torch.Tensor] = []

    def wants(self, position: int, count: int) -> bool:
        """Whether the logits of ``count`` positions from sequence ``position`` on predict a token to score."""
        return position + count >= self.first and position + 1 < len(self.ids)

    def add(self, position: int, logits: torch.Tensor) -> None:
        """``logits[i]``: the prediction made at sequence position ``position + i``, of token ``position + i + 1``
        (rows that predict a token before :attr:`first` or past the prompt's end are ignored)."""
        skip = max(self.first - 1 - position, 0)
        end = min(len(logits), len(self.ids) - 1 - position)
        if end <= skip:
            return
        if position + 1 + skip != self._next:
            raise RuntimeError(f"prompt scores out of order: token {position + 1 + skip} after {self._next - 1}")
        logprobs = F.log_softmax(logits[skip:end].float(), dim=-1)
        targets = self.ids[self._next:self._next + len(logprobs)].to(logprobs.device).unsqueeze(-1)
        token = logprobs.gather(-1, targets)
        self._token += token.squeeze(-1).tolist()
        self._ranks += (logprobs >= token).sum(dim=-1).tolist()
        if self.top > 0:
            values, indices = logprobs.topk(self.top, dim=-1)
            self._top_ids += indices.tolist()
            self._top_logprobs += values.tolist()
        else:
            self._top_ids += [[] for _ in range(len(logprobs))]
            self._top_logprobs += [[] for _ in range(len(logprobs))]
        if self.rows:
            self._rows.append(logprobs.cpu())
        self._next += len(logprobs)

    def scores(self) -> PromptScores:
        if self._next != len(self.ids):
            raise RuntimeError(f"tokens {self.first} to {self._next - 1} of the prompt's {len(self.ids)} were scored")
        return PromptScores(self._token, self._ranks, self._top_ids, self._top_logprobs,
                            torch.cat(self._rows) if self._rows else None)
