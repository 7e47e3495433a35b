"""The time left of a running experiment (kvlab.experiments.eta) and the tail of its workers' log
(kvlab.experiments.worker_logs), on records as the store hands them out and on a real worker's log."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from kvlab.dashboard import experiment_view, formatting
from kvlab.experiments import eta, worker_logs
from kvlab.store.records import ExperimentRecord, TelemetrySample, TrialRecord
from tests.waiting import SAFETY_S

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def experiment(id: int = 1, status: str = "running", model: str = "smollm2-135m", backend: str = "embedded",
               created_s: float = 600, started_s: float | None = 500, finished_s: float | None = None,
               items_done: int = 0) -> ExperimentRecord:
    """An experiment created ``created_s`` seconds before NOW, started and finished as given (seconds before NOW)."""
    def at(seconds: float | None) -> datetime | None:
        return None if seconds is None else NOW - timedelta(seconds=seconds)

    return ExperimentRecord(id=id, name=f"e{id}", tags=[], notes="", spec={}, seed=0, model=model,
                            backend_kind=backend, versions={}, git_commit=None, hardware={}, status=status,
                            error=None, created_at=at(created_s), started_at=at(started_s),
                            finished_at=at(finished_s), items_done=items_done)


def trial(position: int, items_total: int | None, item_limit: int | None = None) -> TrialRecord:
    return TrialRecord(id=position + 1, experiment_id=1, position=position, config_name=f"c{position}", config={},
                       status="running", worker_id=None, claimed_at=None, heartbeat_at=None, started_at=None,
                       finished_at=None, attempts=1, error=None, items_total=items_total, items_done=0,
                       item_limit=item_limit)


def test_evaluations_planned_counts_known_totals_limits_and_the_spec_plan():
    assert eta.evaluations_planned([trial(0, 10), trial(1, 10)], None) == 20
    assert eta.evaluations_planned([trial(0, 10), trial(1, None)], None) is None  # a queued trial, no plan
    assert eta.evaluations_planned([trial(0, 10), trial(1, None)], 10) == 20
    assert eta.evaluations_planned([trial(0, 10, item_limit=4), trial(1, None, item_limit=4)], 10) == 8


def test_past_runs_of_the_same_model_and_backend_give_the_pace_before_the_run_has_its_own():
    now_running = experiment(items_done=2)
    past = [experiment(2, "done", started_s=4000, finished_s=3000, items_done=100),  # 10 s per evaluation
            experiment(3, "done", started_s=2000, finished_s=1800, items_done=100),  # 2 s
            experiment(4, "done", started_s=2000, finished_s=1900, items_done=25),  # 4 s
            experiment(5, "done", backend="vllm", started_s=900, finished_s=800, items_done=1),  # another backend
            experiment(6, "done", model="other", started_s=900, finished_s=800, items_done=1),  # another model
            experiment(7, "failed", started_s=900, finished_s=800, items_done=1),  # not finished well
            experiment(8, "done", started_s=None, finished_s=800)]  # never ran
    pace = eta.past_pace(now_running, past)
    assert pace is not None and pace.seconds_per_evaluation == 4.0  # the median of 10, 2 and 4
    assert "#2" in pace.basis and "#5" not in pace.basis and "embedded" in pace.basis
    left = eta.estimate(now_running, [trial(0, 10), trial(1, 10)], past, NOW)
    # their pace includes their load: 20 evaluations are 80 s from the first claim, 500 s ago -- 420 s past it
    assert left is not None and left.evaluations_left == 18 and left.span_s == 80.0
    assert left.seconds_left == 0.0 and left.overdue_s == 420.0 and left.stage == "evaluating"
    assert left.pace == pace  # 2 evaluations of its own are too few to go by


def test_the_runs_own_pace_takes_over_once_it_has_enough_evaluations():
    running = experiment(started_s=100, items_done=eta.MIN_OWN_EVALUATIONS * 5)
    past = [experiment(2, "done", started_s=4000, finished_s=3000, items_done=10)]
    left = eta.estimate(running, [trial(0, 40), trial(1, 40)], past, NOW)
    assert left is not None and left.pace.seconds_per_evaluation == pytest.approx(100 / running.items_done)
    assert "own pace" in left.pace.basis and left.evaluations_left == 80 - running.items_done
    assert eta.estimate(replace(running, status="done"), [trial(0, 40)], past, NOW) is None  # ended: nothing left
    assert eta.estimate(experiment(items_done=1), [trial(0, 40)], [], NOW) is None  # no pace to go by


def sample(worker: str, ts: float, phase: str) -> TelemetrySample:
    return TelemetrySample(experiment_id=1, worker_id=worker, ts=ts, phase=phase, source="cpu")


def test_the_timeline_parts_queue_load_and_evaluation():
    samples = [sample("w1", 10, "load"), sample("w1", 11, "load"), sample("w1", 16, "prefill"),
               sample("w1", 17, "decode"), sample("w2", 10, "load"), sample("w2", 13, "decode")]
    assert eta.load_seconds(samples) == 6.0  # w1 loaded from 10 until its first other sample at 16
    line = eta.timeline(experiment(created_s=600, started_s=500), samples, NOW)
    assert (line.total_s, line.queued_s, line.load_s, line.evaluating_s) == (600, 100, 6.0, 494)
    queued = eta.timeline(experiment(created_s=30, started_s=None), [], NOW)
    assert (queued.total_s, queued.queued_s, queued.load_s, queued.evaluating_s) == (30, 30, None, 0)
    assert eta.load_seconds([sample("w1", 1, "decode")]) is None


def test_the_log_tail_keeps_its_workers_sections_in_time_order_redacted(tmp_path):
    (tmp_path / "worker-1-0.log").write_text(
        "2026-03-01 11:00:00,000 kvlab.experiments.worker INFO worker host-1-aaaaaa on sqlite:///x\n"
        "2026-03-01 11:00:02,000 kvlab.experiments.worker INFO claimed\n"
        "2026-03-01 11:30:00,000 kvlab.experiments.worker INFO worker host-9-bbbbbb on sqlite:///x\n"
        "2026-03-01 11:30:01,000 other INFO another worker's line\n")
    (tmp_path / "worker-2-0.log").write_text(
        "2026-03-01 11:00:01,000 kvlab.experiments.worker INFO worker host-2-cccccc on "
        "postgresql://kv:hunter2-secret@db/kv\n"
        "Traceback (most recent call last):\n"  # an unstamped line stays after its stamped one
        "2026-03-01 11:00:03,000 kvlab.experiments.worker INFO done\n")
    tail = worker_logs.worker_log_tail({"host-1-aaaaaa", "host-2-cccccc"}, since=0, folder=tmp_path)
    assert len(tail.lines) == 5 and tail.files == [tmp_path / "worker-1-0.log", tmp_path / "worker-2-0.log"]
    assert [line[11:19] for line in tail.lines if line[0].isdigit()] == ["11:00:00", "11:00:01", "11:00:02",
                                                                          "11:00:03"]
    assert tail.lines[2] == "Traceback (most recent call last):"
    assert not any("another worker" in line or "hunter2" in line for line in tail.lines)
    assert len(worker_logs.worker_log_tail({"host-1-aaaaaa"}, since=0, folder=tmp_path, lines=1).lines) == 1
    future = (tmp_path / "worker-1-0.log").stat().st_mtime + 3600
    assert worker_logs.worker_log_tail({"host-1-aaaaaa"}, since=future, folder=tmp_path).lines == []


def test_a_real_workers_first_line_opens_its_section(tmp_path):
    """`kvlab worker` itself, on an empty store: its first line names it as the tail looks for it."""
    log = tmp_path / "worker-test-0.log"
    with log.open("wb") as output:
        subprocess.run([sys.executable, "-m", "kvlab.cli", "worker", "--exit-when-idle"], check=True,
                       stdout=output, stderr=subprocess.STDOUT, timeout=SAFETY_S,
                       env=dict(os.environ, KVLAB_DATABASE_URL=f"sqlite:///{tmp_path / 'kvlab.sqlite'}"))
    (worker,) = worker_logs.worker_sections(log.read_text())
    assert worker.startswith(socket.gethostname() + "-")
    assert worker_logs.worker_log_tail({worker}, since=0, folder=tmp_path).files == [log]


def test_a_long_log_is_read_from_its_end_with_each_line_still_its_workers(tmp_path, monkeypatch):
    """Only the last TAIL_BYTES of a file are read; the lines at the window's start belong to the worker whose
    first line came before it, found by a scan that a later read continues (a log that grows as the page reads)."""
    monkeypatch.setattr(worker_logs, "TAIL_BYTES", 200)
    log = tmp_path / "worker-7-0.log"

    def header(worker: str) -> str:
        return f"2026-03-01 10:00:00,000 kvlab.experiments.worker INFO worker {worker} on sqlite:///x\n"

    def lines(worker: str, count: int, start: int = 0) -> str:
        return "".join(f"2026-03-01 10:{minute // 60:02d}:{minute % 60:02d},000 x INFO {worker} line {minute}\n"
                       for minute in range(start, start + count))

    log.write_text(header("host-1-aaaaaa") + lines("one", 40) + header("host-2-bbbbbb") + lines("two", 40))
    assert log.stat().st_size > 10 * worker_logs.TAIL_BYTES
    two = worker_logs.worker_log_tail({"host-2-bbbbbb"}, since=0, folder=tmp_path).lines
    assert two and all(" two line " in line for line in two) and two[-1].endswith("two line 39")
    assert worker_logs.worker_log_tail({"host-1-aaaaaa"}, since=0, folder=tmp_path).lines == []
    with log.open("a") as grown:  # the scan goes on from where it stopped
        grown.write(lines("two", 30, start=40) + header("host-3-cccccc") + lines("three", 1))
    assert worker_logs.worker_log_tail({"host-2-bbbbbb"}, since=0, folder=tmp_path).lines[-1].endswith("two line 69")
    assert worker_logs.worker_log_tail({"host-3-cccccc"}, since=0, folder=tmp_path).lines[-1].endswith("three line 0")
    log.write_text(header("host-4-dddddd") + lines("four", 40))  # the file rewritten: scanned again from its start
    assert worker_logs.worker_log_tail({"host-4-dddddd"}, since=0, folder=tmp_path).lines[-1].endswith("four line 39")


def test_the_eta_moves_with_time_through_the_queue_and_the_model_load():
    """Issue 47 row 4: "about 6 s left for 6 evaluations … the model's load included" stood still from 2.5 s to
    14.9 s with "0/? items", and the run finished at 22.9 s.  The clock is injected (``now``): while queued the
    page says so and counts the wait; once claimed, the past runs' estimate (their load included) counts down
    from the claim, and past it says by how much it is late; never a frozen figure."""
    created = NOW - timedelta(seconds=60)
    claimed = created + timedelta(seconds=2.5)
    past = [experiment(2, "done", started_s=4000, finished_s=3994, items_done=6)]  # 1 s per evaluation, load included
    queued = replace(experiment(started_s=None), created_at=created)
    running = replace(experiment(), created_at=created, started_at=claimed)
    trials = [trial(0, None), trial(1, None)]

    def at(record: ExperimentRecord, seconds: float) -> tuple[eta.Eta, str]:
        left = eta.estimate(record, trials, past, created + timedelta(seconds=seconds), per_config=3)
        assert left is not None
        return left, experiment_view.eta_text(left)

    first, text = at(queued, 1.0)
    assert first.stage == "queued" and first.stage_s == 1.0 and text.startswith("queued 1 s (no worker has claimed it")
    assert "then about 6 s for 6 evaluations" in text
    assert at(queued, 2.0)[1] != text  # the wait grows
    seen = []
    for seconds in (2.5, 5.0, 8.0, 14.9, 22.0):
        left, text = at(running, seconds)
        assert left.stage == "starting" and left.stage_s == pytest.approx(seconds - 2.5)
        assert text.startswith("starting: loading the model and its first items "
                               f"({formatting.fmt_duration(seconds - 2.5)} so far)")
        seen.append((left.seconds_left, left.overdue_s, text))
    assert [s for s, _, _ in seen] == pytest.approx([6.0, 3.5, 0.5, 0.0, 0.0])  # counts down from the claim
    assert [o for _, o, _ in seen] == pytest.approx([0.0, 0.0, 0.0, 6.4, 13.5])  # then grows past it
    assert "about 6 s left for 6 evaluations" in seen[0][2] and "6 s past the estimate for 6" in seen[3][2]
    assert len({t for _, _, t in seen}) == len(seen)  # a different text at every moment
    evaluating = replace(running, items_done=2)
    left, text = at(evaluating, 5.0)
    assert left.stage == "evaluating" and text.startswith("about 4 s left for 4 evaluations")
