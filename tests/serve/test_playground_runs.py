"""The playground's runs in ``kvlab serve``: the last prefill reused by the next run of the same item (the same
answers and kept tokens as the path that prefills each layout on its own), a run stopped when asked, and the
streamed run over HTTP: progress events, then the answer; a client that goes away stops its run."""

from __future__ import annotations

import json

import httpx
import pytest

from kvlab.core.kv_config import BASELINE
from tests.serving import API_KEY
from tests.waiting import SAFETY_S

pytestmark = pytest.mark.model

MODEL = "smollm2-135m"
#: An eviction config in each layout and quantization alone and combined: every path a playground run takes.
CONFIGS = [{"evict": "streaming_llm", "ratio": 0.75}, {"evict": "snapkv", "ratio": 0.75, "query_aware": True},
           {"quant": "int4"}, {"quant": "int4", "evict": "snapkv", "ratio": 0.75, "query_aware": True}]
BODY = {"model": MODEL, "item": {"task": "passkey", "context_length": 512, "depth": 0.5, "seed": 3},
        "configs": CONFIGS}


@pytest.fixture
def playground(engine):
    from kvlab.serve.generation import ServedModel
    from kvlab.serve.playground import Playground

    return Playground(ServedModel(engine, MODEL, BASELINE))


#: What a run measures of its own time (the rest of an answer is what the run computed).
TIMES = ("ttft_s", "tpot_s")


def _by_config(answer):
    return {r["config"]: {k: v for k, v in r.items() if k not in TIMES} for r in answer["results"]}


def test_a_second_run_of_the_same_item_reuses_the_prefill_and_answers_as_the_unshared_path(playground, engine,
                                                                                          monkeypatch):
    import torch

    from kvlab.engines import embedded
    from kvlab.engines.embedded_session import SessionModes
    from kvlab.serve.playground import PlaygroundRequest
    from kvlab.threads import threads_sleep

    request = PlaygroundRequest(**BODY)
    prepared = playground.prepare(request)
    calls = []
    original = engine._run_prefill

    def counted(*args, **kwargs):
        calls.append(len(args[0]))
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "_run_prefill", counted)  # the prefills computed
    threads = []
    decode_batch = embedded.decode_batch

    def decoding(*args, **kwargs):
        threads.append(torch.get_num_threads())
        return decode_batch(*args, **kwargs)

    monkeypatch.setattr(embedded, "decode_batch", decoding)
    first = playground.run(prepared)
    # one thread where OpenMP threads sleep (tests/conftest.py sets it, unless the environment chose a policy)
    assert threads and set(threads) == ({1} if threads_sleep() else {torch.get_num_threads()})
    again = playground.run(playground.prepare(request))
    monkeypatch.undo()
    assert len(calls) == 1  # one prefill, shared by both layouts, reused by the second run
    # the path of an experiment: each layout prefilled on its own, nothing shared or kept
    with engine.session(SessionModes(report_positions=True)):
        unshared = {r.config_name: r for r in engine.evaluate(prepared.item, prepared.configs)}
    assert first is not None and again is not None
    for label, result in _by_config(again).items():
        alone = unshared[label]
        assert result == _by_config(first)[label]  # the reused prefill: the very same answer, bytes, fidelity
        assert result["generated"] == alone.generated, label
        assert result["kept_positions"] == alone.extra["kept_positions"], label
        assert result["physical_bytes"] == alone.physical_kv_bytes, label
    assert {r["config"] for r in again["results"]} >= {"streaming_llm:r0.75", "int4/g64/r64"}
    assert engine._held_prefill.held is None  # the experiment's path kept nothing: its prefills dropped the held one
    monkeypatch.setattr(engine, "_run_prefill", counted)
    other = playground.run(playground.prepare(PlaygroundRequest(**BODY | {"item": BODY["item"] | {"seed": 4}})))
    monkeypatch.undo()
    assert other is not None and other["item"]["context"] != first["item"]["context"]
    assert len(calls) == 2  # another item: its own prefill


@pytest.mark.parametrize("configs", [CONFIGS, [{"evict": "snapkv", "ratio": 0.75}]],
                         ids=["shared by both layouts", "one layout's with its scores"])
def test_a_prefill_asked_ahead_is_the_one_its_run_uses(playground, engine, monkeypatch, configs):
    """``prefill_only`` (the dashboard asks when it shows an item): the server prefills the item as its run would
    and keeps it; the run then computes no prefill and answers as a run that prefilled for itself."""
    from kvlab.serve.playground import PlaygroundRequest

    body = BODY | {"item": BODY["item"] | {"seed": 8}, "configs": configs}
    fresh = playground.run(playground.prepare(PlaygroundRequest(**body)))
    playground.run(playground.prepare(PlaygroundRequest(**body | {"item": BODY["item"] | {"seed": 9}})))
    calls = []
    original = engine._run_prefill

    def counted(*args, **kwargs):
        calls.append(len(args[0]))
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "_run_prefill", counted)
    ahead = playground.prepare(PlaygroundRequest(**body, prefill_only=True))
    assert playground.run(ahead) == {"prefilled": {"context_tokens": len(ahead.context["input_ids"])}}
    assert len(calls) == 1 and engine.phase == "idle"
    after = playground.run(playground.prepare(PlaygroundRequest(**body)))
    assert len(calls) == 1  # the run found its prefill done
    assert fresh is not None and after is not None and _by_config(after) == _by_config(fresh)


def test_a_cancelled_run_stops_within_a_layer_and_frees_the_engine(playground, engine):
    from kvlab.engines.embedded_session import SessionModes
    from kvlab.serve.playground import PlaygroundRequest

    prepared = playground.prepare(PlaygroundRequest(**BODY | {"item": BODY["item"] | {"seed": 5}}))
    progress = playground.progress_of(prepared)
    seen = []

    def cancelled() -> bool:  # asked at every attention layer: stop once decoding has begun
        seen.append(engine.phase)
        return engine.phase == "decode"

    assert playground.run(prepared, cancelled, progress) is None
    assert seen[-1] == "decode" and "prefill" in seen and progress.answered == []
    assert engine.phase == "idle"
    assert engine.modes == SessionModes()  # all off: experiments decode on the prefill's threads again
    assert playground.run(prepared) is not None  # the next run answers


def _events(response) -> list[dict]:
    return [json.loads(line.removeprefix("data: ")) for line in response.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def test_a_streamed_run_sends_its_progress_then_its_answer_and_stops_when_its_client_goes(kvlab_server):
    root = kvlab_server[1].removesuffix("/v1")
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = BODY | {"item": BODY["item"] | {"seed": 6}, "stream": True}
    with httpx.Client(timeout=SAFETY_S) as client:
        with client.stream("POST", f"{root}/kvlab/playground", json=body, headers=headers) as response:
            assert response.status_code == 200
            events = _events(response)
        progress = [e["progress"] for e in events if "progress" in e]
        assert progress[0]["phase"] == "queued" and {p["total"] for p in progress} == {len(CONFIGS) + 1}
        assert "prefill" in {p["phase"] for p in progress}
        assert [r["config"] for r in events[-1]["answer"]["results"]][0] == "baseline"
        # a client that goes once the run is under way: the server records it gone and its engine is free
        with client.stream("POST", f"{root}/kvlab/playground", json=body | {"item": BODY["item"] | {"seed": 7}},
                           headers=headers) as response:
            for line in response.iter_lines():
                if '"phase": "prefill"' in line or '"phase": "decode"' in line:
                    break
        refused = client.post(f"{root}/kvlab/playground", json=body | {"configs": [{"evict": "tova",
                                                                                 "heads": "adakv"}]},
                              headers=headers)
        assert refused.status_code == 400  # checked before any stream starts: a status, not an event
        answer = client.post(f"{root}/kvlab/playground", json=BODY, headers=headers).json()
        assert answer["results"][0]["config"] == "baseline"
        metrics = client.get(f"{root}/metrics").text
    gone = [line for line in metrics.splitlines() if line.startswith("kvlab:requests_total")
            and 'endpoint="/kvlab/playground"' in line and 'status="499"' in line]
    assert gone and float(gone[0].split()[-1]) >= 1
