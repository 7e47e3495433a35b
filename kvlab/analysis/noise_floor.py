"""The serving engine's own noise floor, beside every config's fidelity.

A serving engine's logits depend on how the tokens were batched: llama.cpp's differ between a prompt and its
continuation evaluated in one batch or in two, vLLM's between a prompt read from the prefix cache and one prefilled
afresh (it has a batch-invariant mode for that reason).  A config's sampled KL against the baseline carries that
noise too, so a margin below it cannot be met and a config inside it cannot be told from the baseline.

On a server kvlab measures it per item with the estimator of every config (:meth:`kvlab.engines.server_fidelity.
ServerScorer.noise_floor`): the baseline's reference log-probabilities, scored right after its sample with its
prompt cached, against the same tokens scored afresh on the same server (``cache_salt``: no prefix reused, prompt and
continuation in one pass).  The floor is the mean over items with its 95% t interval, as for a config
(:mod:`kvlab.analysis.fidelity`).  The embedded engine computes the same forward every time: it has no floor to
measure (its fidelity is exact).

Under a ``[load]`` the baseline's server measures it once more, at the closed level of the most clients: the same
references scored afresh while that many clients keep the server busy (continuous batching puts the scoring in a
batch with their decodes; :meth:`kvlab.engines.openai_compat.OpenAICompatEngine.measure_load`).  It is stored with
that level (:class:`kvlab.load.metrics.LevelResult`) and shown beside the quiet floor.

Pure: the results in, the floor and its lines out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvlab.analysis.fidelity import FidelitySummary
from kvlab.core.results import NOISE_FLOOR_KEY, NOISE_FLOOR_NOTE_KEY, Fidelity, ItemResult
from kvlab.load.metrics import LevelResult

if TYPE_CHECKING:  # kvlab compare reads the floor without the spec's models (pydantic)
    from kvlab.analysis.summary import ConfigSummary
    from kvlab.core.margins import Margins
    from kvlab.store.records import LoadLevelRecord

#: What the floor compares, in the words a report shows.
HOW = "the baseline's server scoring its own sample with its prompt cached vs prefilled afresh"
HOW_UNDER_LOAD = "scored afresh while {clients:g} clients kept the server busy"


@dataclass(frozen=True)
class NoiseFloor:
    """The engine's noise floor of one experiment: the baseline against itself over its items."""

    summary: FidelitySummary
    how: str = HOW

    @property
    def mean_kl(self) -> float:
        return self.summary.mean_kl

    @property
    def interval(self) -> tuple[float, float]:
        return self.summary.kl_interval()

    def to_dict(self) -> dict[str, Any]:
        low, high = self.interval
        return {"items": self.summary.items, "tokens": self.summary.tokens, "mean_kl": self.mean_kl,
                "kl_ci": [low, high], "how": self.how}

    def words(self) -> str:
        low, high = self.interval
        return (f"engine noise floor: mean KL {self.mean_kl:.4f} [{low:.4f}, {high:.4f}] nats per token over "
                f"{self.summary.items} items ({self.how})")

    def holds(self, summary: ConfigSummary) -> bool:
        """Whether the config's KL interval lies inside the floor's: it cannot be told from the engine's noise."""
        return summary.kl_ci_high is not None and summary.kl_ci_high <= self.interval[1]


def noise_floor(results: Sequence[ItemResult], baseline_name: str) -> NoiseFloor | None:
    """The floor over the baseline's results that carry one (None where none does: the embedded engine, an
    endpoint that cannot score afresh)."""
    baseline = [r for r in results if r.config_name == baseline_name and r.error is None]
    floors = [Fidelity.from_dict(r.extra[NOISE_FLOOR_KEY]) for r in baseline if NOISE_FLOOR_KEY in (r.extra or {})]
    return NoiseFloor(FidelitySummary.of(floors)) if floors else None


def floor_notes(results: Sequence[ItemResult], baseline_name: str) -> list[str]:
    """Why the baseline's server measured no floor on some items (one line per reason)."""
    return sorted({note for r in results if r.config_name == baseline_name
                   and (note := (r.extra or {}).get(NOISE_FLOOR_NOTE_KEY))})


def floor_lines(floor: NoiseFloor, summaries: Sequence[ConfigSummary], baseline_name: str,
                margins: Margins | None) -> list[str]:
    """The floor, the configs indistinguishable from it, and a fidelity margin set inside it (one line each)."""
    lines = [floor.words()]
    inside = [s.config_name for s in summaries if s.config_name != baseline_name and floor.holds(s)]
    if inside:
        lines.append(f"indistinguishable from the engine's own noise (KL interval inside the floor's): "
                     f"{', '.join(inside)}")
    low, high = floor.interval
    if margins is not None and margins.max_kl and margins.max_kl < high:  # 0: no fidelity margin
        lines.append(f"warning: max_kl = {margins.max_kl:g} lies inside the engine's noise floor (mean KL "
                     f"{floor.mean_kl:.4f} [{low:.4f}, {high:.4f}]): at that margin a config cannot be told from "
                     "the engine's own noise; raise it above the floor or use a batch-invariant engine")
    return lines


def floor_under_load(records: Sequence[LoadLevelRecord], baseline_name: str) -> NoiseFloor | None:
    """The floor the baseline's server measured beside its load (None where it measured none)."""
    for record in records:
        level = LevelResult.from_dict(record.result)
        if record.config_name == baseline_name and level.noise_floor:
            floors = [Fidelity.from_dict(found) for found in level.noise_floor]
            return NoiseFloor(FidelitySummary.of(floors), HOW_UNDER_LOAD.format(clients=level.level))
    return None


def under_load_lines(records: Sequence[LoadLevelRecord], baseline_name: str) -> list[str]:
    """The floor under load in the words of :meth:`NoiseFloor.words`, or why the baseline's levels measured none."""
    if (floor := floor_under_load(records, baseline_name)) is not None:
        return [f"under load, {floor.words()}"]
    return sorted({note for record in records if record.config_name == baseline_name
                   and (note := LevelResult.from_dict(record.result).noise_floor_note)})
