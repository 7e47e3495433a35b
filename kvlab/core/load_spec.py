"""A spec's ``[load]`` table: what compression buys, measured -- every config's server gets the same KV memory
budget, and the task's own prompts are sent to it under load (closed loop: N clients each sending its next request
when its last one ends; open loop: Poisson arrivals at a rate), after its items are scored.

In ``kvlab tune`` a candidate's server is measured under the load once it runs on all the items (the last rung),
and the baseline's once it does: a load phase per candidate would cost more than its items on the first rungs.

The field's definitions (those ``vllm bench serve`` prints: request and output token throughput, TTFT, TPOT, ITL,
end-to-end latency) are :mod:`kvlab.load.metrics`'s; the load itself is :mod:`kvlab.load.client`'s.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvlab.core.units import MIB

#: At most this many levels of each kind, and requests per level: a load phase runs per config.
MAX_LEVELS = 12
MAX_REQUESTS = 10_000


class LoadTarget(BaseModel):
    """``[load.target]``: what a config's server must hold at one closed-loop level for the sweet spot to be it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    clients: Annotated[int, Field(ge=1, le=4096)] = Field(
        description="The closed-loop level the target is read at: one of load.concurrency.")
    min_output_tokens_per_s: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="The least output tokens/s the server must serve at that level.")
    max_p99_ttft_ms: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="The longest p99 time to first token (ms) it may take at that level.")

    @model_validator(mode="after")
    def _some_bound(self) -> LoadTarget:
        if self.min_output_tokens_per_s is None and self.max_p99_ttft_ms is None:
            raise ValueError("give min_output_tokens_per_s, max_p99_ttft_ms or both")
        return self

    def words(self) -> str:
        bounds = [f"at least {self.min_output_tokens_per_s:g} output tokens/s"] if self.min_output_tokens_per_s else []
        bounds += [f"p99 TTFT at most {self.max_p99_ttft_ms:g} ms"] if self.max_p99_ttft_ms else []
        return f"{' and '.join(bounds)} at {self.clients} clients"


class LoadSpec(BaseModel):
    """``[load]``: one KV budget for every config, and the load levels each config's server is measured at."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kv_budget_mib: Annotated[float, Field(gt=0, le=4 * 1024 * 1024)] | None = Field(
        default=None,
        description="The KV-cache memory every config's server gets, in MiB (vLLM's --kv-cache-memory-bytes, "
                    "SGLang's --max-total-tokens from each config's bytes per token): a compressed config fits more "
                    "tokens in it, not less memory. It sizes the pool of the whole run (its items too), so "
                    "server.kv_cache_gib and server.memory_fraction are left unset. Required on a server kvlab "
                    "launches; unset on an endpoint (it sized its own pool).")
    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default=[1, 2, 4, 8], max_length=MAX_LEVELS,
        description="Closed-loop levels: N clients, each sending its next request as soon as its last one ends "
                    "(vllm bench serve --max-concurrency N). Empty: none.")
    request_rates: list[Annotated[float, Field(gt=0, le=10_000)]] = Field(
        default=[], max_length=MAX_LEVELS,
        description="Open-loop levels in requests per second: Poisson arrivals, seeded by the spec's seed "
                    "(vllm bench serve --request-rate R). Empty: none.")
    requests: Annotated[int, Field(ge=1, le=MAX_REQUESTS)] = Field(
        default=16, description="Requests sent at each level, the task's prompts in turn (repeated when there are "
                                "fewer items).")
    output_tokens: Annotated[int, Field(ge=1, le=65_536)] = Field(
        default=64, description="Tokens every request generates, past its end-of-sequence where the server takes "
                                "ignore_eos (vLLM, SGLang; vllm bench serve --ignore-eos); elsewhere at most.")

    target: LoadTarget | None = Field(
        default=None, description="A throughput or latency target at one closed-loop level ([load.target]): the "
                                  "sweet spot is then the most compressed acceptable config whose server holds it. "
                                  "In kvlab tune it is a constraint: a candidate whose server misses it stops.")

    @field_validator("concurrency", "request_rates")
    @classmethod
    def _distinct_sorted(cls, levels: list[float]) -> list[float]:
        if len(set(levels)) != len(levels):
            raise ValueError(f"each level once: {levels}")
        return sorted(levels)

    @model_validator(mode="after")
    def _some_level(self) -> LoadSpec:
        if not self.concurrency and not self.request_rates:
            raise ValueError("give at least one load level: concurrency (closed loop) or request_rates (open loop)")
        if self.target is not None and self.target.clients not in self.concurrency:
            raise ValueError(f"target.clients {self.target.clients} is no closed-loop level of this load: add it to "
                             f"concurrency ({self.concurrency})")
        return self

    @property
    def kv_budget_bytes(self) -> int | None:
        return None if self.kv_budget_mib is None else round(self.kv_budget_mib * MIB)

    def levels(self) -> list[tuple[str, float]]:
        """(mode, level) in the order they run: the closed loop's concurrencies, then the open loop's rates."""
        return [("closed", float(n)) for n in self.concurrency] + [("open", rate) for rate in self.request_rates]


def stored_load_target(spec: dict[str, Any]) -> LoadTarget | None:
    """The ``[load.target]`` of a spec as the store holds it (None without one)."""
    target = (spec.get("load") or {}).get("target")
    return None if target is None else LoadTarget.model_validate(target)
