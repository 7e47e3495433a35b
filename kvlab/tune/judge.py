"""Which candidates stop, which get more items: successive halving on the paired rule.

Every candidate is compared with the baseline on the *same* first ``n`` items, by the sweet-spot
rule itself (:mod:`kvlab.analysis.verdict`: task by task, fidelity where a margin is set and the
engine measures it, else the paired accuracy interval), uncorrected while the search runs; the
final decision corrects across every candidate examined.
Items come in rungs (``min_items``, x ``eta``, ..., all).  After each rung a candidate:

* **stops, clearly inferior**, when on some task a whole 95% interval lies beyond a margin (its
  accuracy difference below ``-max_drop``, its mean KL above ``max_kl``): more items cannot make it
  acceptable;
* **stops, over a latency limit**, when its median TTFT / TPOT exceeds ``max_ttft_ms`` / ``max_tpot_ms``;
* **stops, short of the load target**, on the last rung, when its server missed the ``[load.target]`` (its
  throughput or p99 TTFT at the target's clients, measured once it ran every item);
* **stops, dominated**, when it holds at least as many bytes as a candidate already shown
  non-inferior on every item: it cannot be the sweet spot (the most compressed non-inferior config);
* **is complete** on the last rung;
* otherwise **waits** at its rung and is **promoted** (asynchronous successive halving, ASHA) while
  it is among the most compressed ``1/eta`` of the candidates that reached the rung, counting only
  the plausibly acceptable ones (point estimates within the margins on every task).  Once the
  sampler proposes nothing more, the most compressed plausible waiting candidate of each rung is
  promoted each round, until the rest are dominated.

Pure functions over plain values: the driver feeds them what the store holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from kvlab.analysis.decision import PairedScores
from kvlab.analysis.verdict import TaskVerdict
from kvlab.core.margins import Margins
from kvlab.core.units import MIB


@dataclass(frozen=True)
class Evidence:
    """A candidate as judged now: its rung, and what its first ``n_items`` items show against the
    baseline's same items."""

    trial_id: int
    label: str
    rung: int
    n_items: int
    paired: PairedScores
    kv_bytes: float
    ttft_ms: float | None
    tpot_ms: float | None
    # the sweet-spot rule on these items, task by task (uncorrected); () judges by the pooled accuracy
    verdicts: tuple[TaskVerdict, ...] = ()
    margins: Margins | None = None
    # why its server missed the [load.target] (measured on the last rung only); None: held it, or not measured
    load_problem: str | None = None

    @property
    def interval(self) -> tuple[float, float]:
        return self.paired.interval()

    def plausible(self, max_drop: float) -> bool:
        if self.verdicts and self.margins is not None:
            return all(v.plausible(self.margins) for v in self.verdicts)
        return self.paired.difference > -max_drop

    def non_inferior(self, max_drop: float) -> bool:
        """Acceptable on these items (the rule's verdict on every task that can judge)."""
        if self.verdicts:
            judged = [v.accepted for v in self.verdicts if v.accepted is not None]
            return bool(judged) and all(judged)
        return self.interval[0] > -max_drop

    @property
    def _worst_kl(self) -> TaskVerdict | None:
        """The task whose mean KL has the highest upper bound (None where not measured)."""
        return max((v for v in self.verdicts if v.kl_high is not None), key=lambda v: cast(float, v.kl_high),
                   default=None)  # (kl_high: not None, as filtered)

    @property
    def mean_kl(self) -> float | None:
        """Mean KL against the baseline on the worst task (:attr:`_worst_kl`)."""
        return self._worst_kl.mean_kl if self._worst_kl else None

    @property
    def kl_high(self) -> float | None:
        """The upper end of that task's 95% interval of the mean KL."""
        return self._worst_kl.kl_high if self._worst_kl else None

    def slack(self, max_drop: float) -> float:
        """The rule's distance from accepting it on these items (<= 0: acceptable): the worst task's."""
        if self.verdicts and self.margins is not None:
            gaps = [gap for v in self.verdicts if (gap := v.slack(self.margins)) is not None]
            return max(gaps) if gaps else 1.0
        return -(self.interval[0] + max_drop)

    def hopeless(self, max_drop: float) -> str | None:
        """Why more items cannot make it acceptable; None while they could."""
        if self.verdicts and self.margins is not None:
            return next((why for v in self.verdicts if (why := v.hopeless(self.margins))), None)
        low, high = self.interval
        return (f"accuracy difference [{low:+.3f}, {high:+.3f}] lies below -{max_drop:g}"
                if high < -max_drop else None)


@dataclass(frozen=True)
class Limits:
    max_drop: float
    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None


@dataclass(frozen=True)
class Verdict:
    state: str  # active | stopped | complete
    reason: str | None = None
    promote_to: int | None = None  # the rung to run next (active only)


def latency_problem(evidence: Evidence, limits: Limits) -> str | None:
    for name, value, limit in (("TTFT", evidence.ttft_ms, limits.max_ttft_ms),
                               ("TPOT", evidence.tpot_ms, limits.max_tpot_ms)):
        if limit is not None and value is not None and value > limit:
            return f"median {name} {value:.0f} ms over the limit of {limit:g} ms"
    return None


def confirmed(evidence: Evidence, last_rung: int, limits: Limits) -> bool:
    """Shown non-inferior on every item, within the latency limits and holding the load target: a sweet-spot
    candidate."""
    return (evidence.rung == last_rung and evidence.non_inferior(limits.max_drop)
            and latency_problem(evidence, limits) is None and evidence.load_problem is None)


def judge(waiting: list[Evidence], reached: dict[int, list[Evidence]], best: Evidence | None, last_rung: int,
          limits: Limits, eta: int, exploring: bool) -> dict[int, Verdict]:
    """Verdicts for the candidates that finished their rung (``waiting``); those left out wait.

    ``reached[r]``: every candidate that ever reached rung ``r`` (waiting there, promoted past it
    or stopped), with its latest evidence: the ASHA quota of rung ``r`` is ``len(reached[r]) //
    eta`` promotions.  ``best``: the most compressed confirmed candidate so far.  ``exploring``:
    the sampler may still propose candidates (else the final phase promotes one per rung).
    """
    verdicts: dict[int, Verdict] = {}
    for evidence in waiting:
        if why := evidence.hopeless(limits.max_drop):
            verdicts[evidence.trial_id] = Verdict("stopped", f"clearly inferior after {evidence.n_items} items: {why}")
        elif problem := latency_problem(evidence, limits):
            verdicts[evidence.trial_id] = Verdict("stopped", f"{problem} after {evidence.n_items} items")
        elif evidence.load_problem:
            verdicts[evidence.trial_id] = Verdict("stopped", f"its server missed the load target "
                                                             f"({evidence.load_problem})")
        elif best is not None and best.trial_id != evidence.trial_id and evidence.kv_bytes >= best.kv_bytes:
            verdicts[evidence.trial_id] = Verdict("stopped", (
                f"dominated: no smaller than {best.label} ({best.kv_bytes / MIB:.2f} MiB), already acceptable "
                f"on all {best.n_items} items"))
        elif evidence.rung == last_rung:
            verdicts[evidence.trial_id] = Verdict("complete")
    for rung in range(last_rung):
        here = {e.trial_id for e in waiting if e.rung == rung and e.trial_id not in verdicts}
        if not here:
            continue
        ever = reached.get(rung, [])
        plausible = sorted((e for e in ever if e.plausible(limits.max_drop)), key=lambda e: (e.kv_bytes, e.trial_id))
        if exploring:
            quota = len(ever) // eta
            slots = quota - sum(1 for e in ever if e.rung > rung)
            chosen = [e for e in plausible[:quota] if e.trial_id in here][:max(slots, 0)]
        else:
            chosen = [e for e in plausible if e.trial_id in here][:1]
        for evidence in chosen:
            verdicts[evidence.trial_id] = Verdict("active", promote_to=rung + 1)
    return verdicts


def leftover_reason(evidence: Evidence, eta: int, max_drop: float) -> str:
    """Why a candidate still waiting when the search ends was never promoted."""
    if not evidence.plausible(max_drop):
        kl = f", mean KL {evidence.mean_kl:.3g}" if evidence.mean_kl is not None else ""
        return (f"not promoted: after {evidence.n_items} items its estimates lie outside the margins "
                f"(accuracy difference {evidence.paired.difference:+.3f}{kl})")
    return (f"not promoted: not among the most compressed 1/{eta} of the plausible candidates "
            f"after {evidence.n_items} items")
