"""The rounds of a tune: propose, run through the store, judge, promote or stop, then recommend.

The driver never evaluates anything itself.  Each round it adds the sampler's proposals to the
tune's experiment as trials limited to their first items and raises the limits of the promoted
ones; workers -- the driver's own in-process one, ``kvlab worker`` on other hosts, Ray actors --
run them like any other trials (one execution path; a worker batches the round's trials, so they
share each item's prefill).  It then judges every candidate that finished its items
(:mod:`kvlab.tune.judge`), reports the finished ones to Optuna, and goes on until the budget is
spent and no candidate is left waiting.  Its state is the store's and the study's, so a tune
killed at any point resumes with ``kvlab tune --resume ID``.
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import optuna

from kvlab.analysis.decision import PairedScores
from kvlab.analysis.noise_floor import floor_lines, floor_under_load, noise_floor, under_load_lines
from kvlab.analysis.summary import ConfigSummary, Decision, decide, summarize
from kvlab.analysis.verdict import judge_tasks
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.results import ItemResult
from kvlab.core.tune_spec import TuneSpec, backend_space, rungs
from kvlab.engines.base import EngineFailure
from kvlab.experiments.load_report import gain_text, levels_by_config, target_lines, target_problem
from kvlab.store import ExperimentStore, StoreError
from kvlab.store.records import CandidateRecord, TrialRecord
from kvlab.store.tunes import study_name
from kvlab.tune import study as studies
from kvlab.tune.judge import Evidence, Limits, Verdict, confirmed, judge, leftover_reason
from kvlab.tune.recommend import recommendation

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
#: Proposals in a row that repeat a config already tried before the space counts as exhausted.
MAX_REPEATS = 30


class Executor(Protocol):
    """Runs the experiment's queued trials; ``drain`` returns once none is queued or running."""

    def drain(self, experiment_id: int, stopping: Callable[[], bool]) -> None: ...


@dataclass
class Budget:
    """How much of the search's budget is spent, and whether it is used up."""

    proposed: int  # distinct candidates (a proposal repeating one costs nothing)
    minutes: float
    item_evals: int

    def spent(self, tune: TuneSpec) -> str | None:
        """Why no more candidates may be proposed, if so."""
        if tune.max_trials is not None and self.proposed >= tune.max_trials:
            return f"max_trials = {tune.max_trials} candidates proposed"
        return self.exhausted(tune)

    def exhausted(self, tune: TuneSpec) -> str | None:
        """Why nothing more may run at all (time or evaluations), if so."""
        if tune.max_minutes is not None and self.minutes >= tune.max_minutes:
            return f"max_minutes = {tune.max_minutes:g} reached"
        if tune.max_item_evals is not None and self.item_evals >= tune.max_item_evals:
            return f"max_item_evals = {tune.max_item_evals} item evaluations used"
        return None


class Tuner:
    """Drives one tune (see the module docstring).  ``items``: the spec's items in the workers' order
    (:func:`kvlab.experiments.runner.build_items`); ``say``: one line per round for the terminal."""

    def __init__(self, store: ExperimentStore, experiment_id: int, spec: ExperimentSpec, items: Sequence[TaskItem],
                 executor: Executor, driver_id: str, say: Callable[[str], None] = log.info) -> None:
        if spec.tune is None:
            raise ConfigError("the spec has no [tune] table: `kvlab run` runs a fixed list of configs")
        self.store, self.experiment_id, self.spec, self.executor = store, experiment_id, spec, executor
        self.driver_id, self.say = driver_id, say
        self.tune, notes = backend_space(spec.tune, spec.backend.kind)
        for note in notes:
            say(note)
        self.order = {(item.item_id, item.task): i for i, item in enumerate(items)}
        self.rungs = rungs(len(items), self.tune.min_items, self.tune.eta)
        self.limits = Limits(spec.max_drop, self.tune.max_ttft_ms, self.tune.max_tpot_ms)
        self.target = spec.load.target if spec.load is not None else None
        self.study = studies.open_study(store.study_storage_url(), study_name(experiment_id), self.tune, spec.seed)
        self._stop = threading.Event()

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Rounds until done; returns the recommendation (also stored with the tune)."""
        beat = threading.Thread(target=self._heartbeat, name="kvlab-tune-heartbeat", daemon=True)
        beat.start()
        try:
            return self._rounds()
        except BaseException:
            self._stop.set()
            raise
        finally:
            self._stop.set()
            beat.join(timeout=HEARTBEAT_S * 2)

    def _rounds(self) -> dict[str, Any]:
        exploring, repeats, why_stopped, stalled = True, 0, "", 0
        while True:
            if self._cancelled():
                self._fail_open_proposals()
                self.store.finish_tune(self.experiment_id, "cancelled", None, None)  # ended by the cancel already
                self.say("tune cancelled")
                return {}
            budget = self._budget()
            if exploring and (why := budget.spent(self.tune)):
                exploring, why_stopped = False, why
                self.say(f"no more proposals: {why}")
            if exploring:
                try:
                    _, repeats = self._propose(repeats)
                except StoreError:
                    if self._cancelled():  # cancelled while proposing: its trials could not be added
                        continue
                    raise
                if repeats >= MAX_REPEATS:
                    exploring, why_stopped = False, "the sampler keeps proposing configs already tried"
                    self.say(f"no more proposals: {why_stopped}")
            try:
                self._cover_baseline()
                self.executor.drain(self.experiment_id, self._cancelled)
                if self._cancelled():
                    continue
                baseline = self.store.trials(self.experiment_id)[0]
                if baseline.status == "failed":  # nothing can be judged without it
                    note = f"the baseline failed: {baseline.error}"
                    self._fail_open_proposals()
                    self.store.finish_tune(self.experiment_id, "failed", None, note)
                    raise EngineFailure(note)
                open_left, decided = self._judge(exploring=exploring,
                                                 hard_stop=self._budget().exhausted(self.tune))
            except StoreError:
                if self._cancelled():  # cancelled between reads: the store refuses to promote its trials
                    continue
                raise
            if not exploring and not open_left:
                break
            stalled = 0 if decided or exploring else stalled + 1
            if stalled >= 2:  # open candidates whose trials give no evidence: end rather than spin
                self._stop_open("no complete evidence: its trial ended without a result for every item")
                break
        return self._finish(why_stopped)

    def _stop_open(self, reason: str) -> None:
        for candidate in self.store.candidates(self.experiment_id):
            if candidate.state == "active" and candidate.number is not None:
                self.store.judge_candidate(candidate.trial_id, state="stopped", reason=reason)
                studies.fail(self.study, candidate.number)

    def _cancelled(self) -> bool:
        return self.store.get_experiment(self.experiment_id).status == "cancelled"

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if not self.store.tune_heartbeat(self.experiment_id, self.driver_id):
                    log.warning("this process is no longer the tune's driver")
            except Exception as error:  # noqa: BLE001 -- a missed beat is retried; staleness takes a minute
                log.warning("tune heartbeat failed: %s", error)

    def _budget(self) -> Budget:
        record = self.store.tune(self.experiment_id)
        started = record.started_at if record else datetime.now(UTC)
        trials = self.store.trials(self.experiment_id)
        return Budget(proposed=sum(1 for c in self.store.candidates(self.experiment_id) if c.number is not None),
                      minutes=(datetime.now(UTC) - started).total_seconds() / 60,
                      item_evals=sum(t.items_done for t in trials))

    # -- proposals --------------------------------------------------------------------------------

    def _propose(self, repeats: int) -> tuple[int, int]:
        """Ask the sampler for this round's candidates; a repeat of a config already tried costs
        nothing (:meth:`_tell_repeat`)."""
        trials = self.store.trials(self.experiment_id)
        known = {t.config_name: t for t in trials}
        new: list[tuple[KVCacheConfig, optuna.Trial]] = []
        budget = self._budget()
        room = (self.tune.max_trials - budget.proposed) if self.tune.max_trials is not None else 10**9
        attempts = 0
        while len(new) < min(self.tune.candidates_per_round, room) and repeats < MAX_REPEATS and attempts < 200:
            attempts += 1
            trial = self.study.ask()
            config = studies.suggest_config(trial, self.tune)
            label = config.label
            if label in known or label in {c.label for c, _ in new}:
                repeats += 1
                self._tell_repeat(trial.number, known.get(label))
                continue
            repeats = 0
            new.append((config, trial))
        if new:
            ids = self.store.add_candidates(self.experiment_id, [(c, t.number) for c, t in new], self.rungs[0])
            for trial_id, (_, trial) in zip(ids, new, strict=True):
                trial.set_user_attr("kvlab_trial_id", trial_id)  # each Optuna trial names its kvlab trial
            self.say(f"round: {len(new)} new candidate(s) on {self.rungs[0]} items: "
                     + ", ".join(c.label for c, _ in new))
        return len(new), repeats

    def _tell_repeat(self, number: int, original: TrialRecord | None) -> None:
        """Tell a repeated proposal what its original showed: a candidate's latest verdict, the
        baseline's own bytes and accuracy (feasible by definition); FAIL while nothing is known."""
        if original is not None and original.position == 0:
            rows = self._results_by_config().get(original.config_name, [])
            kv = [r.physical_kv_bytes for r in rows if r.physical_kv_bytes is not None]
            if kv:
                ttft = [r.ttft_s * 1000 for r in rows if r.ttft_s is not None and r.ttft_s == r.ttft_s]
                tpot = [r.tpot_s * 1000 for r in rows if r.tpot_s is not None and r.tpot_s == r.tpot_s]
                latency = self._latency_constraints(statistics.median(ttft) if ttft else None,
                                                    statistics.median(tpot) if tpot else None)
                studies.tell(self.study, number, statistics.fmean(kv), statistics.fmean(map(_score, rows)),
                             {"rule": -self.limits.max_drop} | latency | self._load_constraint(None))
                return
        candidate = {c.trial_id: c for c in self.store.candidates(self.experiment_id)}.get(
            original.id if original else -1)
        evidence = None
        if original is not None and candidate is not None:
            results = self._results_by_config()
            baseline = self.store.trials(self.experiment_id)[0]
            evidence = self._evidence(original, candidate, results.get(original.config_name, []),
                                      self._scores(results.get(baseline.config_name, [])))
        if evidence is None or evidence.kv_bytes == float("inf"):
            studies.fail(self.study, number)  # nothing known yet: the sampler learns from the original later
            return
        studies.tell(self.study, number, evidence.kv_bytes, evidence.paired.config_mean,
                     self._constraints_of(evidence))

    # -- rounds -----------------------------------------------------------------------------------

    def _cover_baseline(self) -> None:
        """The baseline runs on every item any candidate will run on: each is compared on the same items."""
        trials = self.store.trials(self.experiment_id)
        baseline = trials[0]
        wanted = max((t.item_limit or len(self.order)) for t in trials)
        if (baseline.item_limit or len(self.order)) < wanted:
            self.store.extend_trials([baseline.id], wanted)

    def _judge(self, exploring: bool, hard_stop: str | None) -> tuple[int, bool]:
        """Judge every candidate that finished its items; returns how many are still open, and
        whether any verdict was reached."""
        trials = {t.id: t for t in self.store.trials(self.experiment_id)}
        baseline = next(iter(trials.values()))
        candidates = {c.trial_id: c for c in self.store.candidates(self.experiment_id)}
        for trial in trials.values():
            if trial.id not in candidates:  # the baseline and any fixed [[configs]] of the spec
                self.store.track_trial(self.experiment_id, trial.id)
        candidates = {c.trial_id: c for c in self.store.candidates(self.experiment_id)}
        results = self._results_by_config()
        base_scores = self._scores(results.get(baseline.config_name, []))
        evidence: dict[int, Evidence] = {}
        for trial_id, candidate in candidates.items():
            trial = trials[trial_id]
            if trial_id == baseline.id or trial.status in ("failed", "cancelled"):
                continue
            found = self._evidence(trial, candidate, results.get(trial.config_name, []), base_scores)
            if found is not None:
                evidence[trial_id] = found
                self.store.judge_candidate(trial_id, **_verdict_fields(found, self.limits.max_drop))
        for trial in trials.values():  # failed trials are finished, for the sampler too
            record = candidates.get(trial.id)
            if trial.status == "failed" and record and record.state == "active":
                self.store.judge_candidate(trial.id, state="stopped", reason=f"failed: {trial.error}")
                if record.number is not None:
                    studies.fail(self.study, record.number)
        last = len(self.rungs) - 1
        ended = [e for e in evidence.values() if candidates[e.trial_id].state == "complete"]
        best = min((e for e in ended if confirmed(e, last, self.limits)), key=lambda e: e.kv_bytes, default=None)
        waiting = [e for e in evidence.values() if candidates[e.trial_id].state == "active"
                   and trials[e.trial_id].status == "done"]
        reached: dict[int, list[Evidence]] = {}
        for e in evidence.values():
            for rung in range(e.rung + 1):
                reached.setdefault(rung, []).append(e)
        verdicts = judge(waiting, reached, best, last, self.limits, self.tune.eta, exploring)
        promoting = any(v.promote_to is not None for v in verdicts.values())
        for e in waiting:
            verdict = verdicts.get(e.trial_id)
            if hard_stop and (verdict is None or verdict.promote_to is not None):
                verdicts[e.trial_id] = Verdict("stopped", f"budget spent ({hard_stop})")
            elif verdict is None and not exploring and not promoting:
                verdicts[e.trial_id] = Verdict("stopped", leftover_reason(e, self.tune.eta, self.limits.max_drop))
        self._apply(verdicts, evidence, candidates, baseline.id)
        still = [c for c in self.store.candidates(self.experiment_id)
                 if c.state == "active" and c.trial_id != baseline.id]
        return len(still), bool(verdicts)

    def _apply(self, verdicts: dict[int, Verdict], evidence: dict[int, Evidence],
               candidates: dict[int, CandidateRecord], baseline_id: int) -> None:
        promoted: dict[int, list[int]] = {}
        for trial_id, verdict in verdicts.items():
            e, candidate = evidence[trial_id], candidates[trial_id]
            if verdict.promote_to is not None:
                promoted.setdefault(verdict.promote_to, []).append(trial_id)
                continue
            self.store.judge_candidate(trial_id, state=verdict.state, reason=verdict.reason)
            if candidate.number is not None:
                studies.tell(self.study, candidate.number, e.kv_bytes, e.paired.config_mean,
                             self._constraints_of(e))
            self.say(f"  {e.label}: {verdict.state}" + (f" ({verdict.reason})" if verdict.reason else
                                                        f" on {e.n_items} items"))
        for rung, ids in sorted(promoted.items()):
            self.store.extend_trials(ids, self.rungs[rung], rung=rung)
            self.say(f"  promoted to {self.rungs[rung]} items: "
                     + ", ".join(evidence[i].label for i in ids))

    def _constraints_of(self, e: Evidence) -> dict[str, float]:
        """Feasible (every value <= 0) when the sweet-spot rule accepts it on its items and it keeps the
        latency limits."""
        return ({"rule": e.slack(self.limits.max_drop)} | self._latency_constraints(e.ttft_ms, e.tpot_ms)
                | self._load_constraint(e.load_problem))

    def _load_constraint(self, problem: str | None) -> dict[str, float]:
        """With a ``[load.target]``, one value for every trial alike: 1 when its server missed it, else 0 (not
        measured before the last rung counts as holding it, as an unmeasured latency does)."""
        return {} if self.target is None else {"load": 1.0 if problem else 0.0}

    def _latency_constraints(self, ttft_ms: float | None, tpot_ms: float | None) -> dict[str, float]:
        """One value per latency limit set, for every trial alike (Optuna's GP sampler needs as many
        constraints on each): over the limit > 0; not measured counts as within it."""
        constraints = {}
        limits = (("ttft", ttft_ms, self.limits.max_ttft_ms), ("tpot", tpot_ms, self.limits.max_tpot_ms))
        for key, value, limit in limits:
            if limit is not None:
                constraints[key] = value - limit if value is not None else 0.0
        return constraints

    # -- evidence from the store ------------------------------------------------------------------------

    def _results_by_config(self) -> dict[str, list[ItemResult]]:
        grouped: dict[str, list[ItemResult]] = {}
        for result in self.store.item_results(self.experiment_id):
            grouped.setdefault(result.config_name, []).append(result)
        return grouped

    def _scores(self, results: list[ItemResult]) -> dict[int, ItemResult]:
        """Results by item position (an item's position in the spec's interleaved order)."""
        return {self.order[(r.item_id, r.task)]: r for r in results if (r.item_id, r.task) in self.order}

    def _evidence(self, trial: TrialRecord, candidate: CandidateRecord, results: list[ItemResult],
                  baseline: dict[int, ItemResult]) -> Evidence | None:
        """What the trial's first items show, once it has all of them (and the baseline too)."""
        limit = min(trial.item_limit or len(self.order), len(self.order))
        mine = self._scores(results)
        if any(i not in mine or i not in baseline for i in range(limit)):
            return None
        rows = [mine[i] for i in range(limit)]
        pairs = PairedScores.of([_score(baseline[i]) for i in range(limit)], [_score(r) for r in rows])
        kv = [r.physical_kv_bytes for r in rows if r.physical_kv_bytes is not None]
        ttft = [r.ttft_s * 1000 for r in rows if r.ttft_s is not None and r.ttft_s == r.ttft_s]
        tpot = [r.tpot_s * 1000 for r in rows if r.tpot_s is not None and r.tpot_s == r.tpot_s]
        rung = max((i for i, size in enumerate(self.rungs) if size <= limit), default=0)
        base_rows = [baseline[i] for i in range(limit)]
        verdicts = judge_tasks(base_rows + rows, base_rows[0].config_name, self.spec.margins).get(trial.config_name, [])
        load_problem = None
        if self.target is not None and rung == len(self.rungs) - 1:  # its server ran the load (the worker's rule)
            levels = levels_by_config(self.store.load_levels(self.experiment_id, trial.id))
            load_problem = target_problem(levels.get(trial.config_name, []), self.target)
        return Evidence(trial_id=trial.id, label=trial.config_name, rung=rung, n_items=limit, paired=pairs,
                        kv_bytes=statistics.fmean(kv) if kv else float("inf"),
                        ttft_ms=statistics.median(ttft) if ttft else None,
                        tpot_ms=statistics.median(tpot) if tpot else None,
                        verdicts=tuple(verdicts), margins=self.spec.margins, load_problem=load_problem)

    # -- the end ----------------------------------------------------------------------------------------

    def _finish(self, why_stopped: str) -> dict[str, Any]:
        """Decide among the complete candidates with the sweet-spot rule (Holm across them) and store it."""
        complete = {c.trial_id for c in self.store.candidates(self.experiment_id) if c.state == "complete"}
        trials = self.store.trials(self.experiment_id)
        names = {trials[0].config_name} | {t.config_name for t in trials if t.id in complete}
        results = [r for r in self.store.item_results(self.experiment_id) if r.config_name in names]
        # Every candidate examined counts in Holm's family: the early stops chose who reached the final
        # test on the same items, so correcting across the finalists alone would flatter them.
        untested = sum(1 for t in trials[1:] if t.id not in complete)
        summaries = summarize(results, trials[0].config_name, self.spec.margins, untested=untested)
        decision = decide(summaries, trials[0].config_name, untested=untested)
        baseline = next((s for s in summaries if s.config_name == trials[0].config_name), None)
        layers = next((len(r.extra["cache_layout"]["kept"]) for r in results if "cache_layout" in (r.extra or {})),
                      None)  # the model's depth, where the engine reported its cache layer by layer
        answer = recommendation(self.spec.model, decision, [s for s in summaries if s is not baseline], baseline,
                                layers)
        if self.spec.load is not None:
            answer["load"] = self._load_answer(summaries, trials[0].config_name, decision)
        if (floor := noise_floor(results, trials[0].config_name)) is not None:
            loaded = self.store.load_levels(self.experiment_id, trials[0].id) if self.spec.load is not None else []
            answer["noise_floor"] = floor.to_dict() | {
                "lines": floor_lines(floor, summaries, trials[0].config_name, self.spec.margins)
                + under_load_lines(loaded, trials[0].config_name),
                "under_load": under.to_dict() if (under := floor_under_load(loaded, trials[0].config_name)) else None}
        if len(names) == 1:
            answer["note"] = (f"no candidate reached all {len(self.order)} items: every one stopped early (the tune "
                              "page says why); widen the space, raise max_drop or give more items")
        base_rows = [r for r in results if r.config_name == trials[0].config_name]
        base_kv = [r.physical_kv_bytes for r in base_rows if r.physical_kv_bytes is not None]
        self.store.judge_candidate(trials[0].id, state="complete", judged_items=len(base_rows),
                                   accuracy=statistics.fmean(map(_score, base_rows)) if base_rows else None,
                                   kv_bytes=statistics.fmean(base_kv) if base_kv else None)
        used = sum(t.items_done for t in trials)
        record = self.store.tune(self.experiment_id)
        grid = record.grid_item_evals if record else 0
        answer |= {"item_evals": used, "grid_item_evals": grid, "stopped_because": why_stopped}
        note = f"{used} item evaluations ({used / grid:.0%} of the full grid's {grid})" if grid else None
        self._fail_open_proposals()
        self.store.finish_tune(self.experiment_id, "done", answer, note)
        return answer

    def _load_answer(self, summaries: list[ConfigSummary], baseline_name: str, decision: Decision
                     ) -> dict[str, Any]:
        """What the sweet spot buys under the ``[load]`` (its gain over the baseline), and the target's verdict
        over the complete candidates (who held it, who missed it: those stopped for it say so on the tune page)."""
        records = self.store.load_levels(self.experiment_id)
        spot = decision.sweet_spot
        gain = gain_text(spot, baseline_name, records) if spot is not None else None
        return {"gain": gain, "target": self.target.words() if self.target is not None else None,
                "target_lines": (target_lines(summaries, baseline_name, records, self.target)
                                 if self.target is not None else [])}

    def _fail_open_proposals(self) -> None:
        for trial in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            studies.fail(self.study, trial.number)


def _score(result: ItemResult) -> float:
    return float(result.score) if result.score is not None and result.error is None else 0.0


def _verdict_fields(e: Evidence, max_drop: float) -> dict[str, Any]:
    low, high = e.interval
    return {"rung": e.rung, "judged_items": e.n_items, "accuracy": e.paired.config_mean,
            "diff": e.paired.difference, "diff_low": low, "diff_high": high,
            "kv_bytes": e.kv_bytes if e.kv_bytes != float("inf") else None,
            "ttft_ms": e.ttft_ms, "tpot_ms": e.tpot_ms, "acceptable": e.non_inferior(max_drop),
            "mean_kl": e.mean_kl, "kl_high": e.kl_high}
