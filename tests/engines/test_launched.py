"""The ``vllm`` and ``sglang`` backends: kvlab launches one server per config and drives it over HTTP.

vLLM and SGLang need a CUDA GPU, so the servers launched here are stand-ins
(tests/fake_engines): the same ``python -m ...`` command lines, the real engines' start-up log
lines, and ``kvlab serve``'s OpenAI API underneath (SGLang's native /generate too, which its
fidelity is measured through).  scripts/gpu_check.py runs the real ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.results import TEACHER_BASELINE_SAMPLE
from kvlab.engines.server_fidelity import NOT_MEASURED
from kvlab.experiments.runner import run_experiment
from tests.waiting import SAFETY_S

pytestmark = pytest.mark.model

STAND_INS = Path(__file__).resolve().parents[1] / "fake_engines"
TASKS = [{"name": "passkey", "context_lengths": [256], "depths": [0.5], "num_items": 2, "max_new_tokens": 8}]


def spec_for(kind: str, configs: list[dict]):
    return parse_spec({"name": f"{kind}-sweep", "model": "smollm2-135m", "tasks": TASKS, "configs": configs,
                       "backend": {"kind": kind, "max_concurrency": 2,
                                   "server": {"python": sys.executable, "startup_timeout_s": SAFETY_S}}})


@pytest.fixture
def stand_ins(monkeypatch):
    """The stand-ins play CUDA builds, so the host they run on has a GPU (NVML's answer, stood in)."""
    monkeypatch.setenv("PYTHONPATH", str(STAND_INS))
    monkeypatch.setattr("kvlab.engines.host.host_gpus", lambda: ("NVIDIA H200 (stand-in)",))


@pytest.mark.parametrize("kind, fp8", [("vllm", "fp8_e4m3"), ("sglang", "fp8_e5m2")])
def test_one_server_per_config_with_bytes_from_its_start_up_log(stand_ins, kind, fp8):
    run = run_experiment(spec_for(kind, [{"name": "baseline"}, {"name": "fp8", "quant": fp8}]))
    assert run.failure is None, run.failure
    launches = run.engine["launches"]
    assert [launch["config"] for launch in launches] == ["baseline", "fp8"]
    dtype_flags = [launch["command"][launch["command"].index("--kv-cache-dtype") + 1] for launch in launches]
    assert dtype_flags == ["auto", fp8]
    assert all("tokens" in launch["kv_pool"] or "#tokens" in launch["kv_pool"] for launch in launches)
    by_config = {name: [r for r in run.results if r.config_name == name] for name in ("baseline", "fp8")}
    assert all(len(rows) == 2 and all(r.error is None and r.score is not None for r in rows)
               for rows in by_config.values())
    base = by_config["baseline"][0]
    fp8_row = next(r for r in by_config["fp8"] if r.item_id == base.item_id)
    # 8-bit pool: half the bytes per token of the 16-bit one (to the log's two decimals of GiB).
    assert fp8_row.physical_kv_bytes == pytest.approx(base.physical_kv_bytes / 2, rel=0.01)
    assert fp8_row.compression_ratio == pytest.approx(2.0) and base.compression_ratio == pytest.approx(1.0)
    assert "start-up log" in fp8_row.extra["kv_bytes_source"]
    assert fp8_row.kv.estimated and fp8_row.kv.source.startswith("estimated: ") and fp8_row.kv.analytic_bytes is None
    for launch in launches:  # every server was stopped
        port = launch["command"][launch["command"].index("--port") + 1]
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    # fidelity: the baseline's server sampled each item's continuation, and the fp8 server scored it (vLLM through
    # prompt_logprobs on its OpenAI completions, SGLang through its native /generate: its stand-in, as SGLang,
    # ignores prompt_logprobs there)
    assert all(r.extra["fidelity_reference"]["tokens"] for r in by_config["baseline"])
    for row in by_config["fp8"]:
        assert row.fidelity is not None and row.fidelity.teacher == TEACHER_BASELINE_SAMPLE, row.extra
        assert row.fidelity.tokens >= 1 and "fidelity_note" not in row.extra
    reads = {"vllm": "from prompt_logprobs", "sglang": "from SGLang's /generate input_token_logprobs"}[kind]
    assert reads in run.engine["fidelity"] and "sampled at temperature 1" in run.engine["fidelity"]


def test_sglang_without_generate_logprobs_says_so_in_one_line_and_accuracy_decides(stand_ins, monkeypatch):
    monkeypatch.setenv("KVLAB_STAND_IN_NO_LOGPROBS", "1")  # its /generate answers text and ids, no logprobs
    run = run_experiment(spec_for("sglang", [{"name": "baseline"}, {"name": "fp8", "quant": "fp8_e5m2"}]))
    assert run.failure is None, run.failure
    assert all(r.error is None and r.score is not None and r.fidelity is None for r in run.results)
    notes = {r.extra.get("fidelity_note") for r in run.results if r.config_name == "fp8"}
    assert len(notes) == 1, notes
    note = notes.pop()
    assert note is not None and note.startswith(NOT_MEASURED) and "input_token_logprobs" in note and "\n" not in note
    assert run.engine["fidelity"] == note  # said once, where the engine is described
    fp8 = next(s for s in run.summaries() if s.config_name == "fp8")
    assert fp8.task_verdicts and {v.criterion for v in fp8.task_verdicts} == {"accuracy"}


def test_a_server_that_fails_to_start_stops_the_run_with_its_log(stand_ins, monkeypatch):
    monkeypatch.setenv("KVLAB_STAND_IN_FAIL", "No available memory for the cache blocks")
    run = run_experiment(spec_for("vllm", [{"name": "baseline"}]))
    assert run.results == []
    assert "vllm did not start for baseline: not enough memory" in run.failure and "No available memory" in run.failure
    assert "fix: size the pool smaller" in run.failure and "\n" not in run.failure  # one line, with the log's path


@pytest.mark.parametrize("kind, config, named", [
    ("vllm", {"quant": "int2"}, "fp8_e4m3"),
    ("vllm", {"evict": "snapkv", "ratio": 0.5}, "prefix"),
    ("sglang", {"quant": "int4"}, "fp8_e5m2"),
])
def test_knobs_an_engine_lacks_are_refused_before_launch(stand_ins, kind, config, named):
    with pytest.raises(ConfigError, match=named):
        run_experiment(spec_for(kind, [config]))
