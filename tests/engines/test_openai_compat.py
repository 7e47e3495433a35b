"""The ``openai_compat`` backend against real servers on 127.0.0.1: ``kvlab serve`` and a plain one."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from kvlab.cli.main import main
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.results import TEACHER_BASELINE_SAMPLE
from kvlab.engines.factory import build_engine
from kvlab.engines.openai_compat import EndpointError
from kvlab.experiments.runner import run_experiment
from kvlab.experiments.worker import Worker, WorkerSettings
from kvlab.store import Store
from tests.serving import API_KEY, API_KEY_VAR, PlainOpenAIHandler, kvlab_serve, plain_openai_server

pytestmark = pytest.mark.model

CONFIGS = [{"name": "baseline"}, {"name": "int4", "quant": "int4"},
           {"name": "snapkv-50", "evict": "snapkv", "ratio": 0.5},
           {"name": "snapkv-50-qa", "evict": "snapkv", "ratio": 0.5, "query_aware": True}]
TASKS = [{"name": "passkey", "context_lengths": [384], "depths": [0.3, 0.7], "num_items": 2, "max_new_tokens": 8}]


def spec_for(base_url: str | None, configs=CONFIGS, **backend):
    kind = {"kind": "openai_compat", "base_url": base_url} if base_url else {"kind": "embedded"}
    return parse_spec({"name": "served", "model": "smollm2-135m", "tasks": TASKS, "configs": configs,
                       "backend": kind | backend})


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv(API_KEY_VAR, API_KEY)


def test_served_results_match_the_embedded_engine(kvlab_server, key, engine):
    """Same items, same configs: the same answers and the same measured bytes, over HTTP."""
    embedded = run_experiment(spec_for(None), engine=engine)
    remote = run_experiment(spec_for(kvlab_server[1], api_key_env=API_KEY_VAR, max_concurrency=2))
    assert remote.failure is None and len(remote.results) == len(embedded.results) == 8
    local = {(r.item_id, r.config_name): r for r in embedded.results}
    for result in remote.results:
        twin = local[(result.item_id, result.config_name)]
        # The server stops *before* a stop string (OpenAI's rule); the embedded engine keeps it.
        assert twin.generated.startswith(result.generated) and result.score == twin.score
        assert (result.physical_kv_bytes, result.baseline_kv_bytes, result.kept_fraction) == \
            (twin.physical_kv_bytes, twin.baseline_kv_bytes, twin.kept_fraction)
        assert result.ttft_s > 0 and result.output_tokens >= 1
    assert [s.accuracy for s in remote.summaries()] == [s.accuracy for s in embedded.summaries()]
    assert remote.engine["server"]["engine"] == "embedded" and API_KEY not in json.dumps(remote.to_dict())


def test_cli_run_against_kvlab_serve_writes_results(kvlab_server, key, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{tmp_path / 'kvlab.sqlite'}")  # not the checkout's store
    spec = tmp_path / "served.toml"
    spec.write_text(f'name = "cli"\nmodel = "smollm2-135m"\n[backend]\nkind = "openai_compat"\n'
                    f'base_url = "{kvlab_server[1]}"\napi_key_env = "{API_KEY_VAR}"\n'
                    '[[tasks]]\nname = "passkey"\ncontext_lengths = [256]\nnum_items = 1\nmax_new_tokens = 8\n'
                    '[[configs]]\nname = "baseline"\n[[configs]]\nname = "int8"\nquant = "int8"\n')
    assert main(["run", str(spec), "--quiet", "--json", str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert {r["config_name"] for r in out["results"]} == {"baseline", "int8"}
    printed = capsys.readouterr().out
    assert "sweet spot" in printed
    # fidelity through the endpoint: kvlab serve samples the baseline's continuation and scores it under int8
    by_config = {r["config_name"]: r for r in out["results"]}
    assert by_config["int8"]["extra"]["fidelity"]["teacher"] == TEACHER_BASELINE_SAMPLE
    assert by_config["baseline"]["extra"]["fidelity_reference"]["tokens"] and "sampled at temperature 1" in printed
    assert API_KEY not in (tmp_path / "out.json").read_text()


def test_a_refused_key_stops_the_run_with_the_reason_and_no_key(kvlab_server, monkeypatch):
    monkeypatch.setenv(API_KEY_VAR, "not-the-key-0000000000")
    with pytest.raises(EndpointError) as caught:
        run_experiment(spec_for(kvlab_server[1], api_key_env=API_KEY_VAR))
    message = str(caught.value)
    assert "refused the API key" in message and API_KEY_VAR in message and "kvlab doctor" in message
    assert "not-the-key" not in message and "****0000" in message


def test_a_server_killed_mid_trial_fails_clearly_and_keeps_results(tmp_path, key):
    with kvlab_serve(tmp_path, auth=True) as (process, base_url):
        def kill_after_first(result):
            if process.alive():
                os.kill(process.pid, signal.SIGKILL)

        run = run_experiment(spec_for(base_url, CONFIGS[:2], api_key_env=API_KEY_VAR, max_concurrency=1,
                                      max_retries=1), on_result=kill_after_first)
    assert run.failure is not None and base_url in run.failure
    assert "cannot be reached" in run.failure or "broke off" in run.failure
    assert 1 <= len(run.results) < 4 and all(r.error is None for r in run.results)


def test_a_worker_runs_an_openai_compat_experiment_into_the_store(kvlab_server, key, tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}")
    experiment_id = store.create_experiment(spec_for(kvlab_server[1], CONFIGS[:2], api_key_env=API_KEY_VAR), {})
    Worker(store, WorkerSettings(exit_when_idle=True, heartbeat_s=0.5, telemetry_hz=5)).run()
    trials = store.trials(experiment_id)
    assert [t.status for t in trials] == ["done", "done"]
    results = store.item_results(experiment_id)
    assert len(results) == 4 and all(r.physical_kv_bytes for r in results)
    assert API_KEY not in json.dumps(store.get_experiment(experiment_id).spec)
    sources = {s.source for s in store.telemetry(experiment_id)}
    assert "server" in sources


@pytest.fixture
def plain_server():
    with plain_openai_server() as base_url:
        yield base_url


def test_an_endpoint_that_decides_its_own_cache_runs_only_the_baseline(plain_server):
    engine = build_engine(spec_for(plain_server))
    with pytest.raises(ConfigError, match="decides its own KV cache.*kvlab serve"):
        engine.check_configs(spec_for(plain_server).all_configs())
    engine.check_configs(spec_for(plain_server, [{"name": "baseline"}]).all_configs())
    assert engine.model_id == "plain-model"  # the only model the server lists
    with pytest.raises(ConfigError, match="not served.*plain-model"):
        build_engine(spec_for(plain_server, model_id="gpt-4o")).check_configs([])


def test_a_worker_whose_server_dies_gives_the_trials_back_and_keeps_their_results(tmp_path, key):
    """A dead server is not the spec's fault: the trials go back to the queue (kvlab.experiments.worker)."""
    store = Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}")
    with kvlab_serve(tmp_path, auth=True) as (process, base_url):
        experiment_id = store.create_experiment(
            spec_for(base_url, CONFIGS[:2], api_key_env=API_KEY_VAR, max_concurrency=1, max_retries=1), {})

        def kill_after_first_result():
            while not store.item_results(experiment_id):
                time.sleep(0.05)
            os.kill(process.pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_after_first_result, daemon=True)
        killer.start()
        Worker(store, WorkerSettings(exit_when_idle=True, heartbeat_s=0.5)).run()
        killer.join(timeout=5)
    trials = store.trials(experiment_id)
    assert {t.status for t in trials} == {"queued"}
    assert 1 <= len(store.item_results(experiment_id)) < 4  # what was answered before the kill is kept
    assert any(e.level == "warning" and "EndpointError" in e.message and base_url in e.message
               for e in store.events(experiment_id))


class _RefusesMidStream(PlainOpenAIHandler):
    """A server whose first completion streams a piece of text, then an error event (vLLM's shape of an error met
    inside a streamed 200: ``data: {"error": {...}}``), and whose later completions stream an answer."""

    served = 0
    break_off = False  # the first answer is cut after its first piece instead

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).served += 1
        chunk = {"id": "c", "object": "text_completion", "created": 0, "model": "plain-model",
                 "choices": [{"index": 0, "text": " 4", "finish_reason": None, "logprobs": None}]}
        events = [chunk]
        if self.path.endswith("/v1/completions") and type(self).served == 1 and type(self).break_off:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            line = f"data: {json.dumps(chunk)}\n\n".encode()
            self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")  # and no last chunk: cut
            self.close_connection = True
            return
        if type(self).served == 1:
            events.append({"error": {"object": "error", "message": "Requested tokens (256) exceed context window\n"
                                     "of 128", "type": "BadRequestError", "param": None, "code": 400}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for event in events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


def _run_one_at_a_time(handler: type[PlainOpenAIHandler]):
    with plain_openai_server(handler) as base_url:
        return run_experiment(spec_for(base_url, [{"name": "baseline"}], max_concurrency=1, max_retries=0))


def test_an_error_event_inside_a_streamed_answer_is_that_items_error_in_one_line_naming_the_cause(monkeypatch):
    """Issue 47 row 9: the server's refusal inside a streamed 200 stopped the run ("APIConnectionError: Connection
    error." after 10 s with max_retries 0, no progress for 180 s with retries); it fails that item alone."""
    monkeypatch.setattr(_RefusesMidStream, "served", 0)
    run = _run_one_at_a_time(_RefusesMidStream)
    assert run.failure is None and len(run.results) == 2
    failed, answered = run.results
    assert failed.error == "the server refused it mid-answer: Requested tokens (256) exceed context window of 128"
    assert answered.error is None and answered.generated == " 4"


def test_a_streamed_answer_cut_short_names_what_happened_not_an_unreachable_server(monkeypatch):
    """The issue's "APIConnectionError: Connection error." named no cause: an answer that began and broke off says
    so (the run stops: the server, not the item, is at fault)."""
    monkeypatch.setattr(_RefusesMidStream, "break_off", True)
    monkeypatch.setattr(_RefusesMidStream, "served", 0)
    run = _run_one_at_a_time(_RefusesMidStream)
    assert run.failure is not None and "broke off a streamed answer" in run.failure, run.failure
    assert "cannot be reached" not in run.failure and "\n" not in run.failure
