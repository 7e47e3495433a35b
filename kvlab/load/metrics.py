"""One load level's figures, by the definitions ``vllm bench serve`` prints (``vllm/benchmarks/serve.py``,
``calculate_metrics``), so that kvlab's numbers compare with it:

* **duration**: from the first request sent to the last one finished;
* **request throughput**: completed requests / duration; **output token throughput**: output tokens of the completed
  requests / duration; **total token throughput**: their prompt and output tokens / duration;
* **TTFT**: from sending a request to its first streamed token; **TPOT** of a request: (end-to-end latency - TTFT)
  / (output tokens - 1), for requests of more than one token; **ITL**: each gap between two streamed chunks;
  **E2EL**: from sending to the last byte;
* percentiles are numpy's (linear interpolation), over the completed requests (ITL over every gap).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

#: The percentiles kept of each latency (vllm bench serve prints 99 by default; --metric-percentiles).
PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestRecord:
    """One request as the client saw it; ``error`` set when it did not complete."""

    sent_at: float  # monotonic seconds
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None
    e2el_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if self.error or self.ttft_s is None or self.e2el_s is None or self.output_tokens < 2:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)


def stats(values: Sequence[float]) -> dict[str, float] | None:
    """Mean and :data:`PERCENTILES` of ``values`` in milliseconds (None for none)."""
    if not values:
        return None
    ms = np.asarray(values, dtype=float) * 1000
    return {"mean": float(ms.mean()), **{f"p{p}": float(np.percentile(ms, p)) for p in PERCENTILES}}


@dataclass(frozen=True)
class ServerReading:
    """What the server said of itself while the level ran: the most requests it ran at once and queued, its
    preemptions during the level, the highest share of its KV pool in use (None where it did not say)."""

    max_running: float | None = None
    max_waiting: float | None = None
    preemptions: float | None = None
    max_usage: float | None = None
    samples: int = 0


@dataclass(frozen=True)
class LevelResult:
    """One config at one load level: the client's figures (:func:`level_result`) and the server's."""

    mode: str  # "closed" (clients) or "open" (requests per second)
    level: float
    requests: int
    completed: int
    errors: int
    first_error: str | None
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    prompt_tokens: int
    output_tokens: int
    latency_ms: dict[str, dict[str, float] | None]  # ttft / tpot / itl / e2el -> mean and percentiles
    server: ServerReading
    pool_tokens: int | None = None  # the tokens the server's KV pool holds (as it stated them at launch)
    #: The baseline's closed level of the most clients: each item's :class:`~kvlab.core.results.Fidelity` (as a
    #: dict) of the baseline against itself scored while as many clients kept its server busy
    #: (:mod:`kvlab.analysis.noise_floor`), or why not (``noise_floor_note``).
    noise_floor: list[dict[str, Any]] | None = None
    noise_floor_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LevelResult:
        return cls(**{**data, "server": ServerReading(**data["server"])})

    def latency(self, name: str, stat: str) -> float | None:
        """One figure in ms (``latency("ttft", "p99")``), None where no request gave it."""
        found = self.latency_ms.get(name)
        return None if found is None else found.get(stat)

    @property
    def label(self) -> str:
        return f"{self.level:g} clients" if self.mode == "closed" else f"{self.level:g} req/s"


def level_result(mode: str, level: float, records: Sequence[RequestRecord], duration_s: float,
                 server: ServerReading) -> LevelResult:
    done = [r for r in records if r.error is None]
    failed = [r for r in records if r.error is not None]
    prompt_tokens = sum(r.prompt_tokens for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    latency = {
        "ttft": stats([r.ttft_s for r in done if r.ttft_s is not None]),
        "tpot": stats([t for r in done if (t := r.tpot_s) is not None]),
        "itl": stats([gap for r in done for gap in r.itl_s]),
        "e2el": stats([r.e2el_s for r in done if r.e2el_s is not None]),
    }
    return LevelResult(mode=mode, level=level, requests=len(records), completed=len(done), errors=len(failed),
                       first_error=failed[0].error if failed else None, duration_s=duration_s,
                       request_throughput=per_s(len(done)), output_throughput=per_s(output_tokens),
                       total_token_throughput=per_s(prompt_tokens + output_tokens), prompt_tokens=prompt_tokens,
                       output_tokens=output_tokens, latency_ms=latency, server=server)
