"""The load client and the server monitor against a stand-in scheduler (tests/load/fake_scheduler.py)."""

from __future__ import annotations

import pytest

from kvlab.core.load_spec import LoadSpec
from kvlab.engines.load_monitor import watch_server
from kvlab.load.client import run_beside, run_level
from kvlab.load.metrics import LevelResult, RequestRecord, ServerReading, level_result
from tests.load.fake_scheduler import Scheduler, scheduler_server
from tests.waiting import SAFETY_S


def _level(root: str, clients: int, requests: int, prompts=("a b c", "d e")) -> LevelResult:
    return run_level(f"{root}/v1", "m", list(prompts), "closed", clients, requests, 5,
                     fields={"ignore_eos": True}, watch=watch_server(root, "vllm", period_s=0.02))


@pytest.mark.parametrize(("slots", "running", "waiting"), [(2, 2, 2), (4, 4, 0)])
def test_the_monitor_sees_what_a_pool_admits_and_queues(slots, running, waiting):
    """Four clients on a server that admits two (the baseline's pool) queue two; on one that admits four (a pool
    twice the tokens) none wait."""
    scheduler = Scheduler(slots, clients=4)
    with scheduler_server(scheduler) as root:
        result = _level(root, clients=4, requests=8)
    assert (result.completed, result.errors, result.requests) == (8, 0, 8)
    assert (result.server.max_running, result.server.max_waiting, result.server.preemptions) == (running, waiting, 0)
    assert result.output_tokens == 8 * 5 and result.prompt_tokens == 4 * 3 + 4 * 2  # the prompts in turn
    assert result.output_throughput == pytest.approx(result.output_tokens / result.duration_s)
    assert result.request_throughput == pytest.approx(8 / result.duration_s)
    for name in ("ttft", "tpot", "itl", "e2el"):
        figures = result.latency_ms[name]
        assert figures is not None and figures["p50"] <= figures["p90"] <= figures["p99"], name
    assert result.server.samples >= 2


def test_a_refused_request_is_counted_with_its_reason_and_the_level_goes_on():
    scheduler = Scheduler(4, clients=2)
    scheduler.arrived_cap = 1  # one prompt of two is refused before it queues
    with scheduler_server(scheduler) as root:
        result = _level(root, clients=2, requests=4, prompts=("refuse me", "a b"))
    assert (result.completed, result.errors) == (2, 2) and "HTTP 400" in result.first_error


def test_an_open_loop_sends_every_request_at_seeded_poisson_arrivals():
    scheduler = Scheduler(8, clients=1)
    with scheduler_server(scheduler) as root:
        result = run_level(f"{root}/v1", "m", ["a"], "open", 200.0, 6, 5, seed=3,
                           watch=watch_server(root, "vllm", period_s=0.02))
    assert (result.mode, result.level, result.completed) == ("open", 200.0, 6)
    assert result.label == "200 req/s"


def test_vllm_bench_serves_definitions():
    """TPOT is (E2EL - TTFT) / (tokens - 1) per request, ITL every gap, throughput over the level's duration; a
    one-token request has no TPOT; a failed request counts in neither."""
    records = [RequestRecord(0.0, 10, 5, ttft_s=0.1, e2el_s=0.5, itl_s=[0.1] * 4),
               RequestRecord(0.0, 10, 1, ttft_s=0.2, e2el_s=0.2),
               RequestRecord(0.0, error="HTTP 500: boom")]
    result = level_result("closed", 2, records, 2.0, ServerReading())
    assert result.latency("tpot", "mean") == pytest.approx(100.0)  # (500 - 100) ms / 4, the one-token one left out
    assert result.latency("ttft", "p50") == pytest.approx(150.0) and result.latency("itl", "p99") == pytest.approx(100)
    assert (result.output_throughput, result.request_throughput, result.total_token_throughput) == (3.0, 1.0, 13.0)
    assert (result.errors, result.first_error) == (1, "HTTP 500: boom")
    assert LevelResult.from_dict(result.to_dict()) == result


def test_a_load_table_needs_a_level_and_orders_them():
    spec = LoadSpec(kv_budget_mib=32, concurrency=[8, 1, 4], request_rates=[2.0])
    assert spec.levels() == [("closed", 1.0), ("closed", 4.0), ("closed", 8.0), ("open", 2.0)]
    assert spec.kv_budget_bytes == 32 << 20
    with pytest.raises(ValueError, match="at least one load level"):
        LoadSpec(kv_budget_mib=32, concurrency=[])
    with pytest.raises(ValueError, match="each level once"):
        LoadSpec(kv_budget_mib=32, concurrency=[2, 2])


def test_work_beside_a_load_runs_while_its_clients_keep_the_server_busy():
    """The noise floor under load is scored while as many clients as the level's keep the server busy: the work
    starts with the load running and ends it (the work here waits until a client sent its second request)."""
    scheduler = Scheduler(4, clients=2, gate="none")

    def work() -> str:
        with scheduler.lock:
            assert scheduler.lock.wait_for(lambda: scheduler.arrived >= 3, timeout=SAFETY_S)
        return "scored"

    with scheduler_server(scheduler) as root:
        value, completed, failed = run_beside(f"{root}/v1", "m", ["a b c"], 2, 5, work)
    assert value == "scored" and completed >= 1 and not failed  # three arrivals from two clients: one ended first
