"""``kvlab serve`` against clients that misbehave and faults: clients that leave mid-answer,
SIGTERM with a request in flight, oversized and malformed bodies, out-of-vocabulary token ids,
and an engine that fails in the middle of an answer.

Real ``kvlab serve`` processes on 127.0.0.1 (one shared by the module, without auth; SIGTERM gets
its own), and one in-process server on 127.0.0.1 whose real model is made to fail mid-answer.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import psutil
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from kvlab.engines.managed_server import free_port
from tests.serving import kvlab_serve
from tests.waiting import SAFETY_S, wait_until

pytestmark = pytest.mark.model

MODEL = "smollm2-135m"
VOCAB = 49152  # SmolLM2's embedding rows: valid token ids are 0 ... VOCAB - 1
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"  # the model goes on counting: no early end token
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[psutil.Process, str]]:
    """``(the server process, http://127.0.0.1:PORT)``."""
    with kvlab_serve(tmp_path_factory.mktemp("serve-faults")) as (process, base_url):
        yield psutil.Process(process.pid), base_url.removesuffix("/v1")


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": COUNTING, "max_tokens": 5, "temperature": 0} | fields


def samples(root: str) -> dict[tuple[str, frozenset], float]:
    text = httpx.get(f"{root}/metrics").text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def counted(root: str, endpoint: str, status: int) -> float:
    labels = frozenset({"model_name": MODEL, "endpoint": endpoint, "status": str(status)}.items())
    return samples(root).get(("kvlab:requests_total", labels), 0.0)


def gauge(root: str, name: str) -> float:
    return samples(root)[(f"kvlab:num_requests_{name}", frozenset({"model_name": MODEL}.items()))]


def data_lines(response: httpx.Response) -> Iterator[str]:
    return (line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: "))


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert "Traceback" not in response.text
    return error


# -- clients that leave -----------------------------------------------------------------------


def test_a_client_leaving_mid_stream_stops_its_generation_and_frees_the_engine(served):
    process, root = served
    left_before = counted(root, "/v1/completions", 499)
    with httpx.Client(timeout=30) as client, \
            client.stream("POST", f"{root}/v1/completions", json=completion(max_tokens=300, stream=True)) as response:
        assert response.status_code == 200
        events = data_lines(response)
        chunks = [json.loads(next(events))]
        first = time.perf_counter()
        chunks += [json.loads(next(events)) for _ in range(2)]
        per_token_s = (time.perf_counter() - first) / 2
    assert all(chunk["choices"][0]["text"] for chunk in chunks)  # it was generating: the connection drops here
    left = time.perf_counter()
    wait_until(lambda: gauge(root, "running") == 0, "the engine to be freed", poll_s=0.02)
    freed_s = time.perf_counter() - left
    # Running on to max_tokens would hold the engine ~297 more tokens; stopping takes one.
    assert freed_s < max(2.0, 0.25 * 297 * per_token_s)
    started = time.perf_counter()
    answer = httpx.post(f"{root}/v1/completions", json=completion(), timeout=SAFETY_S)
    answered_s = time.perf_counter() - started
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 5
    assert gauge(root, "running") == 0 and gauge(root, "waiting") == 0
    assert counted(root, "/v1/completions", 499) == left_before + 1
    print(f"\nengine freed {freed_s:.2f} s after the client left (a token: {per_token_s:.3f} s); "
          f"the next request answered in {answered_s:.2f} s")


def test_clients_leaving_a_non_streamed_answer_or_the_queue_are_dropped(served):
    process, root = served
    left_before = counted(root, "/v1/completions", 499)
    outcomes: list[str] = []

    def leave_after(seconds: float) -> None:
        try:
            httpx.post(f"{root}/v1/completions", json=completion(max_tokens=2000), timeout=seconds)
            outcomes.append("answered")
        except httpx.ReadTimeout:
            outcomes.append("left")

    first = threading.Thread(target=leave_after, args=(2.0,))
    first.start()
    wait_until(lambda: gauge(root, "running") == 1 or not first.is_alive(), "the first request to run", poll_s=0.02)
    assert first.is_alive(), "the first request ended before it was seen running"
    leave_after(0.5)  # queued behind the first one, and gives up there
    wait_until(lambda: gauge(root, "waiting") == 0, "the queued request to be dropped", poll_s=0.02)
    first.join()
    wait_until(lambda: gauge(root, "running") == 0, "the running request to be dropped", poll_s=0.02)
    assert outcomes == ["left", "left"]
    assert counted(root, "/v1/completions", 499) == left_before + 2
    assert httpx.post(f"{root}/v1/completions", json=completion(), timeout=SAFETY_S).status_code == 200


# -- SIGTERM ------------------------------------------------------------------------------------


def test_sigterm_stops_the_server_within_5_s_with_a_stream_in_flight(tmp_path):
    with kvlab_serve(tmp_path) as (server, base_url):
        with httpx.stream("POST", f"{base_url}/completions", json=completion(max_tokens=300, stream=True),
                          timeout=30) as response:
            events = data_lines(response)
            assert json.loads(next(events))["choices"]
            signalled = time.perf_counter()
            os.kill(server.pid, signal.SIGTERM)
            rest = list(events)
        ended_s = time.perf_counter() - signalled
        wait_until(lambda: not server.alive(), "the server's exit", poll_s=0.02)
        exit_s = time.perf_counter() - signalled
        log = server.log_text()
    assert rest[-1] == "[DONE]" and json.loads(rest[-2])["error"]["code"] == "shutting_down"
    assert exit_s < 5.0 and "Traceback" not in log
    print(f"\nSIGTERM: the stream ended {ended_s:.2f} s and the process {exit_s:.2f} s after the signal")


# -- bodies -------------------------------------------------------------------------------------


def _huge_body(mib: int) -> bytes:
    return json.dumps(completion(prompt="a" * (mib * MIB))).encode()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_24_mb_body_is_refused_at_once_without_memory(served, chunked):
    process, root = served
    body = _huge_body(24)
    content = (body[i:i + 64 * 1024] for i in range(0, len(body), 64 * 1024)) if chunked else body
    rss_before = process.memory_info().rss
    refused_before = counted(root, "/v1/completions", 413)
    started = time.perf_counter()
    response = httpx.post(f"{root}/v1/completions", content=content, timeout=30,
                          headers={"content-type": "application/json"})
    elapsed = time.perf_counter() - started
    error = assert_openai_error(response, 413)
    assert error["code"] == "request_too_large" and "--max-body-mb" in error["message"]
    assert elapsed < 2.0
    assert process.memory_info().rss - rss_before < 200 * MIB
    assert counted(root, "/v1/completions", 413) == refused_before + 1
    print(f"\n24 MB body ({'chunked' if chunked else 'Content-Length'}): 413 in {elapsed * 1000:.0f} ms, "
          f"server RSS {(process.memory_info().rss - rss_before) / MIB:+.0f} MiB")


def test_a_prompt_under_the_body_limit_but_over_the_context_is_refused_without_tokenizing(served):
    process, root = served
    started = time.perf_counter()
    response = httpx.post(f"{root}/v1/completions", json=completion(prompt="hello world " * 330_000), timeout=30)
    elapsed = time.perf_counter() - started
    assert "maximum context length is 8192" in assert_openai_error(response, 400)["message"]
    assert elapsed < 2.0  # tokenizing these 4 million characters would take seconds
    print(f"\n3.8 MiB prompt: 400 in {elapsed * 1000:.0f} ms")


@pytest.mark.parametrize("prompt", [[1, 2, VOCAB], [-1], [5, 10**30]], ids=["vocab-size", "negative", "huge"])
def test_out_of_vocabulary_token_ids_get_a_400_counted_as_400(served, prompt):
    process, root = served
    before = counted(root, "/v1/completions", 400)
    error = assert_openai_error(httpx.post(f"{root}/v1/completions", json=completion(prompt=prompt)), 400)
    assert error["code"] == "invalid_token_id" and error["param"] == "prompt"
    assert counted(root, "/v1/completions", 400) == before + 1
    assert httpx.post(f"{root}/v1/completions", json=completion(), timeout=SAFETY_S).status_code == 200


@pytest.mark.parametrize("content", [
    b'{"model": "smollm2-135m", "prompt": ',
    b'{"model": "smollm2-135m", "prompt": "\xff\xfe"}',
    b"[]",
    b"",
    b"[" * 100_000 + b"]" * 100_000,
], ids=["broken-json", "not-utf8", "array", "empty", "deeply-nested"])
def test_malformed_bodies_get_an_openai_shaped_400(served, content):
    process, root = served
    before = counted(root, "/v1/completions", 400)
    response = httpx.post(f"{root}/v1/completions", content=content, headers={"content-type": "application/json"})
    assert assert_openai_error(response, 400)["param"] == "body"
    assert counted(root, "/v1/completions", 400) == before + 1


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", rb'{"model": "smollm2-135m", "prompt": "1, 2, \ud800 3", "max_tokens": 2}', "prompt"),
    ("/v1/completions", rb'{"model": "smollm2-135m", "prompt": ["\udfff"], "max_tokens": 2}', "prompt.0"),
    ("/v1/completions", rb'{"model": "smollm2-\ud800", "prompt": "1, 2,"}', "model"),
    ("/v1/completions", rb'{"model": "smollm2-135m", "prompt": "1, 2,", "stop": ["\ud83d"]}', "stop.0"),
    ("/v1/chat/completions", rb'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi \ud800"}]}',
     "messages.0.content"),
    ("/v1/chat/completions", rb'{"model": "smollm2-135m", "messages": [{"role": "user", "content": '
                             rb'[{"type": "text", "text": "\udc00"}]}]}', "messages.0.content.0.text"),
], ids=["prompt", "prompt-list", "model", "stop", "chat", "chat-part"])
def test_a_lone_surrogate_anywhere_in_the_body_gets_a_400_naming_the_field(served, path, body, param):
    """``"\\ud800"`` is valid JSON but no text: no tokenizer takes it and no answer echoing it could be
    encoded (it was a 500, a TypeError from the tokenizer)."""
    process, root = served
    before = counted(root, path, 400)
    response = httpx.post(f"{root}{path}", content=body, headers={"content-type": "application/json"})
    error = assert_openai_error(response, 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{param}: a lone surrogate (\\u")
    assert counted(root, path, 400) == before + 1
    assert httpx.post(f"{root}/v1/completions", json=completion(), timeout=SAFETY_S).status_code == 200
    key = rb'{"model": "smollm2-135m", "prompt": "1,", "\ud800": 1}'  # as a key: pydantic refuses it itself
    assert assert_openai_error(httpx.post(f"{root}/v1/completions", content=key,
                                          headers={"content-type": "application/json"}), 400)["param"] == "body"


def test_unknown_paths_and_methods_get_openai_shaped_errors(served):
    process, root = served
    assert assert_openai_error(httpx.get(f"{root}/v1/nothing-here"), 404)["type"] == "not_found_error"
    assert_openai_error(httpx.get(f"{root}/v1/completions"), 405)
    assert counted(root, "other", 404) >= 1 and counted(root, "/v1/completions", 405) >= 1


# -- an engine that fails mid-answer ----------------------------------------------------------


class _Broken(RuntimeError):
    pass


@pytest.fixture
def failing_server(engine, tmp_path, monkeypatch) -> Iterator[tuple[str, Callable[[int], None]]]:
    """``kvlab serve``'s app on 127.0.0.1 (in this process) over the real model, whose first
    attention layer raises once a given number of forward passes have run (a device fault, say).
    Yields ``(root URL, fail_after(passes))``; logs go under ``tmp_path``."""
    from kvlab.core.kv_config import KVCacheConfig
    from kvlab.serve import ServedModel, create_app

    monkeypatch.setenv("KVLAB_HOME", str(tmp_path))
    monkeypatch.delenv("KVLAB_DEBUG", raising=False)
    fail_after = [10**9]
    passes = [0]

    def fault(module, args):
        passes[0] += 1
        if passes[0] > fail_after[0]:
            raise _Broken("the device fell over")

    handle = engine.modules[0].register_forward_pre_hook(fault)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(ServedModel(engine, MODEL, KVCacheConfig())), host="127.0.0.1",
                                           port=port, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, "the in-process server's start")

        def fail_after_passes(count: int) -> None:
            passes[0], fail_after[0] = 0, count

        yield f"http://127.0.0.1:{port}", fail_after_passes
    finally:
        server.should_exit = True
        thread.join(timeout=SAFETY_S)
        handle.remove()


def test_an_engine_failure_is_a_500_or_an_error_event_counted_as_500(failing_server, tmp_path, capfd):
    root, fail_after = failing_server
    fail_after(0)  # in the prefill
    error = assert_openai_error(httpx.post(f"{root}/v1/completions", json=completion(), timeout=30), 500)
    assert error["type"] == "server_error" and "_Broken" in error["message"]
    assert "fell over" not in error["message"]  # the details are in the log, not the answer

    fail_after(3)  # the prefill and two tokens, then a fault mid-stream
    with httpx.stream("POST", f"{root}/v1/completions", json=completion(max_tokens=50, stream=True),
                      timeout=30) as response:
        assert response.status_code == 200
        events = list(data_lines(response))
    assert json.loads(events[0])["choices"] and json.loads(events[-2])["error"]["type"] == "server_error"
    assert events[-1] == "[DONE]"

    assert counted(root, "/v1/completions", 500) == 2 and counted(root, "/v1/completions", 200) == 0
    assert gauge(root, "running") == 0
    log = (tmp_path / "logs" / "kvlab-serve.log").read_text()
    assert log.count("Traceback") == 2 and "the device fell over" in log
    terminal = capfd.readouterr().err
    assert "Traceback" not in terminal and terminal.count("error: internal error in POST /v1/completions") == 2

    fail_after(10**9)  # the engine works again: nothing was left holding it
    assert httpx.post(f"{root}/v1/completions", json=completion(), timeout=30).status_code == 200


# -- a caller's own item: its scorer and its regular expression ------------------------------------

OWN = {"context": "The sky is blue today.", "question": "\nColour of the sky:", "max_new_tokens": 4}


def own_item(**item) -> dict:
    fields = {key: value for key, value in OWN.items() if key != "max_new_tokens"}
    return {"model": MODEL, "item": fields | item, "max_new_tokens": OWN["max_new_tokens"]}


ONES = " ".join(["1"] * 24)  # the model goes on writing " 1 1 1 ...": 60 of them backtrack for hours


@pytest.mark.parametrize("pattern, bounded", [
    ("(.*.){6}XYZQ", False),  # hung `re`; the regex module finds XYZQ absent and answers at once: a score
    ("( 1| 1 1)+b", True),  # backtracks on every run of " 1": the scorer's time limit trips
])
def test_a_catastrophic_regex_answer_is_bounded_and_the_server_stays_up(served, pattern, bounded):
    """The probe's pattern froze the whole server (health, completions, SIGTERM); now each answer is
    scored within the scorer's time limit, and one that reaches it carries that answer's error."""
    process, root = served
    ask = {"model": MODEL, "item": {"context": ONES, "question": " 1", "answer": pattern, "scorer": "regex"},
           "max_new_tokens": 120, "configs": [{"quant": "int8"}]}
    with httpx.Client(timeout=SAFETY_S) as client:
        answer = client.post(f"{root}/kvlab/playground", json=ask)
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        assert [r["config"] for r in results] == ["baseline", "int8/g64/r64"]
        for result in results:
            assert " 1 1 1 1 1 1 1 1" in result["generated"], result  # the text that backtracks
            if bounded:
                assert result["score"] is None and result["error"].startswith("scoring: the regex answer"), result
            else:
                assert result["score"] == 0.0 and result["error"] is None, result
        assert client.get(f"{root}/health").status_code == 200
        assert client.post(f"{root}/v1/completions", json=completion()).status_code == 200


@pytest.mark.parametrize("pattern, text", [("(a|aa)+b", "a" * 60), ("( 1| 1 1)+b", " 1" * 60)])
def test_backtracking_patterns_stop_at_the_scorers_bound(pattern, text):
    from kvlab.core.items import TaskItem
    from kvlab.tasks.scoring import ScoringError, answer_regex

    # Unbounded, either search runs for hours; the scorer's time limit makes it this item's error.
    with pytest.raises(ScoringError, match="searched this output for over"):
        answer_regex(TaskItem("jsonl", "r", "c", "q", pattern, 16, None, 8), text)


@pytest.mark.parametrize("item, param, says", [
    ({"answer": "([unclosed", "scorer": "regex"}, "item.answer", "answer is not a regular expression"),
    ({"answer": "blue", "scorer": "psychic"}, "item.scorer", "psychic"),
    ({"answer": "blue", "scorer": "numeric", "tolerance": -1}, "item.tolerance", ""),
])
def test_a_bad_own_item_is_a_400_naming_its_field(served, item, param, says):
    process, root = served
    error = assert_openai_error(httpx.post(f"{root}/kvlab/playground", json=own_item(**item), timeout=SAFETY_S), 400)
    assert error["message"].startswith(f"{param}: ") and says in error["message"], error
    assert "GeneratedItem" not in error["message"] and "OwnItem" not in error["message"]
    assert httpx.get(f"{root}/health").status_code == 200


# -- DNS rebinding: a server without a key answers only its own names -----------------------------

@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8000", "127.0.0.1.attacker.example"])
def test_without_a_key_a_request_for_another_host_name_is_refused(served, host):
    process, root = served
    before = counted(root, "/v1/completions", 403)
    refused = httpx.post(f"{root}/v1/completions", json=completion(), headers={"Host": host}, timeout=SAFETY_S)
    error = assert_openai_error(refused, 403)
    assert error["code"] == "host_not_allowed" and "--allowed-host" in error["message"]
    assert counted(root, "/v1/completions", 403) == before + 1
    for name in ("localhost", "127.0.0.1"):  # its own names, with and without the port
        port = root.rpartition(":")[2]
        for header in (name, f"{name}:{port}"):
            assert httpx.get(f"{root}/health", headers={"Host": header}).status_code == 200
