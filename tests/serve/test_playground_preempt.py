"""A prefill asked for ahead (``prefill_only``) never delays a run of another item, whichever client asks for
either (issue 47, row 15: a raw-HTTP playground Run "waits 38.5 s behind another item's 8K prefill"; only the
dashboard's own warm engine used to cancel its prefill ahead).  The real ``kvlab serve`` and the real model:
the prefill ahead is under way when the other item's run is sent, as plain JSON from another client."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.serving import API_KEY
from tests.waiting import SAFETY_S

pytestmark = pytest.mark.model

MODEL = "smollm2-135m"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
CONFIGS = [{"quant": "int4"}]
#: Long enough that its prefill is still under way when the other run is sent (seconds on a CPU).
LONG = {"task": "passkey", "context_length": 6144, "depth": 0.5, "seed": 21}
SHORT = {"task": "passkey", "context_length": 256, "depth": 0.5, "seed": 22}


def _events(lines) -> list[dict]:
    return [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")
            and line != "data: [DONE]"]


def _until_prefilling(lines) -> None:
    """Read the prefill ahead's stream until the engine is prefilling it."""
    for line in lines:
        if line.startswith("data: ") and '"phase": "prefill"' in line:
            return
    raise AssertionError("the prefill ahead ended before it was seen prefilling")


def test_a_run_of_another_item_from_another_client_preempts_a_prefill_ahead(kvlab_server):
    root = kvlab_server[1].removesuffix("/v1")
    ahead_body = {"model": MODEL, "item": LONG, "configs": CONFIGS, "prefill_only": True, "stream": True}
    with httpx.Client(timeout=SAFETY_S) as dashboard, httpx.Client(timeout=SAFETY_S) as raw:
        with dashboard.stream("POST", f"{root}/kvlab/playground", json=ahead_body, headers=HEADERS) as ahead:
            assert ahead.status_code == 200
            lines = ahead.iter_lines()
            _until_prefilling(lines)
            run = raw.post(f"{root}/kvlab/playground", json={"model": MODEL, "item": SHORT, "configs": CONFIGS},
                           headers=HEADERS)
            rest = _events(lines)
    assert run.status_code == 200, run.text
    assert [r["config"] for r in run.json()["results"]] == ["baseline", "int4/g64/r64"]
    assert "prefilled" not in json.dumps(rest), rest  # it did not finish first
    assert rest[-1]["error"]["code"] == "prefill_preempted", rest[-1]
    assert "pre-empted by a run of another item" in rest[-1]["error"]["message"]


def test_a_run_of_the_same_item_leaves_its_prefill_ahead_to_finish_and_uses_it(kvlab_server):
    root = kvlab_server[1].removesuffix("/v1")
    item = LONG | {"context_length": 1024, "seed": 23}
    ahead_body = {"model": MODEL, "item": item, "configs": CONFIGS, "prefill_only": True, "stream": True}
    with httpx.Client(timeout=SAFETY_S) as dashboard, httpx.Client(timeout=SAFETY_S) as raw:
        with dashboard.stream("POST", f"{root}/kvlab/playground", json=ahead_body, headers=HEADERS) as ahead:
            lines = ahead.iter_lines()
            _until_prefilling(lines)
            run = raw.post(f"{root}/kvlab/playground", json={"model": MODEL, "item": item, "configs": CONFIGS},
                           headers=HEADERS)
            rest = _events(lines)
    assert run.status_code == 200, run.text
    assert rest[-1] == {"answer": {"prefilled": {"context_tokens": rest[-1]["answer"]["prefilled"]["context_tokens"]}}}
