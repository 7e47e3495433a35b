"""The playground: its state as a share link, its token maps, "Save as experiment", and the page itself run
against a real `kvlab serve` (attached by KVLAB_PLAYGROUND_URL, as a user's own server would be)."""

from __future__ import annotations

import json

import pytest

from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.limits import PLAYGROUND_NEW_TOKENS
from kvlab.dashboard import page_table
from kvlab.dashboard.playground import (
    DEFAULT_CONFIGS,
    KEPT_ALPHA,
    PlaygroundView,
    answer_spans,
    config_text,
    empty_answer_hint,
    progress_text,
    request_body,
    shade,
    spec_for,
    token_map_html,
)
from tests.dashboard.test_dashboard import assert_clean, open_page, texts
from tests.serving import API_KEY
from tests.waiting import SAFETY_S

PLAYGROUND = page_table.PLAYGROUND.script


def run(at):
    """Click Run, wait for the Run in flight (its own thread) to end, and draw the page with its answer."""
    at.button(key="run").click().run()
    job = at.session_state["playground-run"] if "playground-run" in at.session_state else None
    assert job is None or job.wait(SAFETY_S)
    return at.run()


def test_a_view_is_its_link_and_a_bad_link_says_what_it_dropped():
    view = PlaygroundView(task="multikey", length=512, depth=0.25, config=(config_text({"quant": "int8"}),))
    params = view.params()
    assert params == {"task": "multikey", "length": "512", "depth": "0.25", "config": ['{"quant":"int8"}']}
    assert PlaygroundView.from_params(params) == (view, [])
    assert PlaygroundView().params() == {}  # a first visit: nothing to say
    assert len(PlaygroundView().configs()) == len(DEFAULT_CONFIGS)
    odd, problems = PlaygroundView.from_params({"length": "lots", "source": "moon", "config": ['{"quant":"int3"}']})
    assert odd.length == 1024 and odd.source == "task" and odd.config == PlaygroundView().config
    assert [p.split(":")[0].split("=")[0] for p in problems] == ["length", "config", "source"]
    nine = [config_text({"quant": "int8", "group_size": g, "residual_length": r})
            for g in (32, 64, 128) for r in (0, 16, 32)]
    kept, problems = PlaygroundView.from_params({"config": nine})  # never cut to 8 silently
    assert kept.config == PlaygroundView().config and problems == ["config: 9 configs, at most 8 at once "
                                                                    "(left at its default)"]
    long, problems = PlaygroundView.from_params({"source": "text", "max_new_tokens": str(PLAYGROUND_NEW_TOKENS + 1)})
    assert long.max_new_tokens == PlaygroundView().max_new_tokens and problems == [
        f"max_new_tokens={PLAYGROUND_NEW_TOKENS + 1} is out of range (1-{PLAYGROUND_NEW_TOKENS}); left at its default"]
    assert PlaygroundView.from_params({"max_new_tokens": str(PLAYGROUND_NEW_TOKENS)})[0].max_new_tokens == \
        PLAYGROUND_NEW_TOKENS


def test_the_token_map_escapes_the_text_and_boxes_each_occurrence_of_the_answer_once():
    context = "a <b> 42 & c 42"
    offsets = [(0, 0), (0, 1), (1, 5), (5, 7), (7, 8), (8, 12), (12, 15)]  # a special token first, with no text
    item = {"context": context, "answer": " 42 "}
    assert answer_spans(item) == [(6, 8), (13, 15)]  # stripped, every occurrence
    drawn = token_map_html(context, offsets, [1.0, 1.0, 0.0, 0.5, 0.5, 1.0, 0.0], answer_spans(item), number=3)
    assert "<b>" not in drawn and "&lt;b&gt;" in drawn and "&amp;" in drawn
    # one box per occurrence: the first around its two tokens (" 4", "2"), the second around the last token
    assert drawn.count("<span data-kvlab-answer") == 2 and drawn.count("outline:2px") == 2
    first_box = drawn.split("<span data-kvlab-answer")[1].split("</span></span>")[0]
    assert first_box.count('<span title=') == 2
    assert shade(0.0) in drawn and 'title="kept by 50% of heads"' in drawn
    assert shade(1.0) == f"rgba(31,119,180,{KEPT_ALPHA:.2f})" and KEPT_ALPHA < 0.5  # black text stays readable
    assert 'id="kvlab-token-map-3"' in drawn and "getElementById('kvlab-token-map-3')" in drawn  # opens scrolled
    assert answer_spans({"context": "abc", "answer": ""}) == []
    assert answer_spans({"context": "abc", "answer": "x"}) == []


def test_a_run_in_flight_says_how_far_it_is():
    assert progress_text({"phase": "starting"}, "smollm2-135m") == (
        "Starting `kvlab serve` for smollm2-135m (loading the model: the first Run only)...", 0.0)
    text, share = progress_text({"phase": "prefill", "answered": [], "total": 5, "context_tokens": 1013}, "m")
    assert text == "0 of 5 configs answered · Prefilling the context (1,013 tokens)..." and share == 0
    text, share = progress_text({"phase": "compress", "config": "int4/g64/r64", "total": 5,
                                 "answered": ["baseline", "streaming_llm:r0.75"]}, "m")
    assert text.startswith("2 of 5 configs answered (baseline, streaming_llm:r0.75) · Compressing the cache: int4")
    assert share == 2 / 5


def test_own_text_sends_its_max_new_tokens_and_an_empty_baseline_says_why():
    view = PlaygroundView(source="text", context="c", question="q", max_new_tokens=3)
    assert PlaygroundView.from_params(view.params()) == (view, [])  # in the link like every field
    assert request_body(view)["max_new_tokens"] == 3
    assert "max_new_tokens" not in request_body(PlaygroundView())  # a task's item keeps its own budget

    def answer(generated: str, tokens: int) -> dict:
        return {"results": [{"generated": generated, "output_tokens": tokens}]}

    assert empty_answer_hint(answer(" 42", 2), 3) is None
    assert "stopped at once" in empty_answer_hint(answer("", 1), 3)
    assert "its 3 new tokens (all that Max new tokens allows) were blank" in empty_answer_hint(answer("\n \n", 3), 3)
    assert "its one new token (all that Max new tokens allows) was blank" in empty_answer_hint(answer(" ", 1), 1)
    assert "in 2 tokens, then stopped" in empty_answer_hint(answer("\n", 2), 8)


def test_save_as_experiment_is_a_sweep_of_the_configs_on_the_whole_task():
    from kvlab.core.experiment_spec import parse_spec

    spec = parse_spec(spec_for(PlaygroundView(length=512)))
    assert [c.label for c in spec.configs] == [KVCacheConfig(**c).label for c in DEFAULT_CONFIGS]
    assert spec.tasks[0].name == "passkey" and spec.tasks[0].context_lengths == [512]
    with pytest.raises(ValueError, match="pick a task"):
        spec_for(PlaygroundView(source="text", context="c", question="q"))


@pytest.mark.model
def test_a_playground_link_runs_and_maps_what_each_config_kept(kvlab_server, monkeypatch):
    monkeypatch.setenv("KVLAB_PLAYGROUND_URL", kvlab_server[1].removesuffix("/v1"))
    monkeypatch.setenv("KVLAB_API_KEY", API_KEY)
    configs = [config_text(c) for c in ({"evict": "streaming_llm", "ratio": 0.75},
                                        {"evict": "snapkv", "ratio": 0.75, "query_aware": True})]
    at = open_page(PLAYGROUND, length="512", seed="3", config=configs)
    assert_clean(at)
    assert at.number_input[0].value == 512
    run(at)
    assert_clean(at)
    table = next(df.value for df in at.dataframe if "verdict" in df.value.columns)
    assert list(table["config"]) == ["baseline", "streaming_llm:r0.75", "snapkv:r0.75/qa"]
    assert table["verdict"].iloc[0] == "right" and table["verdict"].iloc[1] == "wrong"
    maps = [element.proto.body for element in at.get("html") if "data-kvlab-map" in element.proto.body]
    item = at.session_state["playground-answer"][1]["item"]
    occurrences = len(answer_spans(item))  # the passkey says its key twice
    assert occurrences >= 2 and len(maps) == 3 and all(m.count("<span data-kvlab-answer") == occurrences
                                                       for m in maps)  # each occurrence boxed once in every map
    # StreamingLLM keeps the sinks and the recent window: the needle, mid-context, is white in its map
    for box in maps[1].split("<span data-kvlab-answer")[1:]:
        needle = box.split("</span></span>")[0].split("<span")[1:]
        assert needle and all(shade(0.0) in part for part in needle)
    assert "streaming_llm" in texts(at.markdown) and "(wrong)" in texts(at.markdown)


@pytest.mark.model
def test_the_warm_engine_starts_its_server_and_starts_it_again_after_it_died(monkeypatch, tmp_path):
    """No KVLAB_PLAYGROUND_URL: the first Run starts `kvlab serve`; a server killed between two Runs is started
    again by the next; a prompt over the model's context is one line, and the Run after it works."""
    from kvlab.dashboard.playground import request_body
    from kvlab.dashboard.warm_engine import PlaygroundError, WarmEngine

    monkeypatch.delenv("KVLAB_PLAYGROUND_URL", raising=False)
    monkeypatch.setenv("KVLAB_LOG_DIR", str(tmp_path))
    engine = WarmEngine("smollm2-135m")
    body = request_body(PlaygroundView(length=256, config=(config_text({"quant": "int4"}),)))
    try:
        assert not engine.started
        first = engine.run(body)
        assert engine.started and [r["config"] for r in first["results"]] == ["baseline", "int4/g64/r64"]
        engine.stop()  # as if it died
        assert not engine.started
        assert engine.run(body)["results"][0]["generated"] == first["results"][0]["generated"]
        with pytest.raises(PlaygroundError, match=r"refused the run \(400\): item passkey/L9000.* exceed "
                                                  r"smollm2-135m's maximum context of 8192"):
            engine.run(body | {"item": {"task": "passkey", "context_length": 9000}})
        assert engine.run(body)["results"][1]["config"] == "int4/g64/r64"
    finally:
        engine.stop()
    assert (tmp_path / "kvlab-playground-serve.log").exists()


def test_a_links_config_keeps_every_field():
    """16-bit layers, a decode policy, a safeguard: each a column of the table, and in the link as it came."""
    from urllib.parse import parse_qs, urlsplit

    from tests.dashboard.test_dashboard import share_link

    configs = [config_text({"quant": "int4", "skip_layers": {"first": 2}}),
               config_text({"evict": "knorm", "decode": {"interval": 40, "target_tokens": 300}}),
               config_text({"evict": "snapkv", "ratio": 0.5, "heads": "adakv", "alpha_safeguard": 0.4})]
    at = open_page(PLAYGROUND, config=configs)
    assert_clean(at)
    assert parse_qs(urlsplit(share_link(at)).query)["config"] == configs


def _rows_file(folder) -> str:
    """A JSONL task file in the data directory ``folder``: 3 rows, the second scored as a number."""
    rows = [{"context": "The vault's code is 4417. The weather was mild.", "question": " The code is",
             "answer": "4417"},
            {"context": "Ann has 3 apples and buys 4 more.", "question": " Ann now has", "answer": "7",
             "scorer": "numeric", "tolerance": 0.01, "id": "apples"},
            {"context": "Paris is the capital of France.", "question": " The capital of France is",
             "answer": "Paris"}]
    (folder / "qa.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return "qa.jsonl"


def test_a_row_of_a_jsonl_file_is_an_input_and_saves_as_a_sweep_of_the_whole_file(monkeypatch, tmp_path):
    from kvlab.core.errors import ConfigError
    from kvlab.core.experiment_spec import parse_spec
    from kvlab.tasks.data_dir import data_files

    monkeypatch.setenv("KVLAB_DATA_DIR", str(tmp_path))
    name = _rows_file(tmp_path)
    (tmp_path / "uploads").mkdir()
    (tmp_path / "uploads" / "more.jsonl").write_text("")
    (tmp_path / "notes.txt").write_text("not a task")
    assert data_files() == ["qa.jsonl", "uploads/more.jsonl"]  # the page's choices
    view = PlaygroundView(source="file", file=name, row=2)
    assert PlaygroundView.from_params(view.params()) == (view, [])
    assert view.item() == {"context": "Ann has 3 apples and buys 4 more.", "question": " Ann now has",
                           "answer": "7", "scorer": "numeric", "tolerance": 0.01}
    with pytest.raises(ConfigError, match=r"qa.jsonl: no row 4 \(rows 1-3\)"):
        PlaygroundView(source="file", file=name, row=4).item()
    with pytest.raises(ConfigError, match="'..' is not allowed"):
        PlaygroundView(source="file", file="../qa.jsonl").item()
    spec = spec_for(view)
    assert spec["tasks"] == [{"name": "jsonl", "path": name}] and spec["name"] == "playground-jsonl"
    parse_spec(spec)


@pytest.mark.model
def test_a_playground_link_runs_a_files_row(kvlab_server, monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_PLAYGROUND_URL", kvlab_server[1].removesuffix("/v1"))
    monkeypatch.setenv("KVLAB_API_KEY", API_KEY)
    monkeypatch.setenv("KVLAB_DATA_DIR", str(tmp_path))
    name = _rows_file(tmp_path)
    at = open_page(PLAYGROUND, source="file", file=name, row="1", config=[config_text({"quant": "int8"})])
    assert_clean(at)
    assert "The code is" in texts(at.caption)  # the row's question, before any Run
    run(at)
    assert_clean(at)
    table = next(df.value for df in at.dataframe if "verdict" in df.value.columns)
    assert list(table["config"]) == ["baseline", "int8/g64/r64"] and set(table["verdict"]) <= {"right", "wrong"}
    maps = [element.proto.body for element in at.get("html") if "data-kvlab-map" in element.proto.body]
    # the answer, found in the context, boxed
    assert len(maps) == 2 and all("<span data-kvlab-answer" in m for m in maps)
    past_the_end = open_page(PLAYGROUND, source="file", file=name, row="9")
    assert "qa.jsonl: no row 9 (rows 1-3)" in texts(past_the_end.error).replace("\\", "")  # before any Run


@pytest.mark.model
def test_the_playground_on_an_endpoint_runs_its_own_cache_without_token_maps(kvlab_server, monkeypatch):
    """An OpenAI-compatible endpoint (here `kvlab serve`, a real server over HTTP): a task's item sized by the
    server's /tokenize, one answer as the server stores it, no token maps, and the configs left as they were;
    a dead endpoint is one line."""
    monkeypatch.setenv("KVLAB_API_KEY", API_KEY)
    monkeypatch.setenv("KVLAB_BASE_URL", kvlab_server[1])  # the key goes only where it belongs
    configs = [config_text({"quant": "int4"})]
    at = open_page(PLAYGROUND, engine="endpoint", base_url=kvlab_server[1], length="256", config=configs)
    assert_clean(at)
    run(at)
    assert_clean(at)
    table = next(df.value for df in at.dataframe if "verdict" in df.value.columns)
    assert len(table) == 1 and table["config"].iloc[0] == "smollm2-135m's cache (baseline)"
    assert table["verdict"].iloc[0] in ("right", "wrong")
    assert float(table["KV (MiB)"].iloc[0]) > 0  # kvlab serve measures what it held (a vLLM's: "~", an estimate)
    (said,) = [c.value for c in at.caption if c.value.startswith("KV cache:")]
    assert "measured" in said and "Token maps need the embedded engine" in said and not at.get("html")
    from urllib.parse import parse_qs, urlsplit

    from tests.dashboard.test_dashboard import share_link

    assert parse_qs(urlsplit(share_link(at)).query)["config"] == configs  # kept for kvlab serve, not run here
    dead = open_page(PLAYGROUND, engine="endpoint", base_url="http://127.0.0.1:9/v1", source="text",
                     context="c", question="q")
    run(dead)
    assert_clean(dead)
    assert "cannot be reached" in texts(dead.error)


def test_an_endpoint_view_saves_as_a_sweep_of_its_own_cache_and_its_link_holds_no_credentials():
    from kvlab.core.experiment_spec import parse_spec

    view, problems = PlaygroundView.from_params({"engine": "endpoint", "base_url": "http://me:pw@host:8000/v1"})
    assert problems == [] and view.base_url == "http://host:8000/v1"
    spec = spec_for(view)
    assert spec["configs"] == [{}] and spec["backend"] == {"kind": "openai_compat", "base_url": "http://host:8000/v1"}
    assert parse_spec(spec).backend.kind == "openai_compat"


def test_the_dashboards_modules_import_no_torch():
    """The dashboard process stays free of torch: the model runs in `kvlab serve` or on an endpoint."""
    import subprocess
    import sys

    probe = ("import importlib, pkgutil, sys, kvlab.dashboard as d\n"
             "for m in pkgutil.iter_modules(d.__path__): importlib.import_module(f'kvlab.dashboard.{m.name}')\n"
             "print(sorted(n for n in sys.modules if n == 'torch' or n.startswith('torch.')))")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=SAFETY_S,
                           check=True)
    assert found.stdout.strip() == "[]", found.stdout[:500]


@pytest.mark.model
def test_a_run_while_the_server_answers_someone_else_waits_its_turn(kvlab_server, monkeypatch):
    """The server busy (an experiment's request streaming): the Run queues for the engine (kvlab serve serves one
    request at a time) and answers once it is its turn; nothing is stuck, and the other request is answered whole."""
    import threading

    import openai

    from kvlab.dashboard.playground import request_body
    from kvlab.dashboard.warm_engine import WarmEngine

    monkeypatch.setenv("KVLAB_PLAYGROUND_URL", kvlab_server[1].removesuffix("/v1"))
    monkeypatch.setenv("KVLAB_API_KEY", API_KEY)
    client = openai.OpenAI(base_url=kvlab_server[1], api_key=API_KEY)
    first_chunk, answered, pieces = threading.Event(), threading.Event(), []

    def someone_else() -> None:
        stream = client.completions.create(model="smollm2-135m", prompt="Once upon a time, " * 40, max_tokens=48,
                                           temperature=0, stream=True)
        for chunk in stream:
            pieces.append(chunk.choices[0].text if chunk.choices else "")
            first_chunk.set()
        answered.set()

    other = threading.Thread(target=someone_else)
    other.start()
    assert first_chunk.wait(SAFETY_S)  # the engine is busy with the other request now
    answer = WarmEngine("smollm2-135m").run(
        request_body(PlaygroundView(length=256, config=(config_text({"quant": "int4"}),))))
    other.join(SAFETY_S)
    assert [r["config"] for r in answer["results"]] == ["baseline", "int4/g64/r64"]
    assert answered.is_set() and "".join(pieces).strip()  # the other request, answered whole


def test_the_page_asks_for_the_prefill_of_the_item_it_shows_and_runs_it(kvlab_server, monkeypatch):
    """A warm server prefills the item a page shows before its Run (WarmEngine.prefill_ahead); the Run answers."""
    from kvlab.dashboard.warm_engine import WarmEngine

    monkeypatch.setenv("KVLAB_PLAYGROUND_URL", kvlab_server[1].removesuffix("/v1"))
    monkeypatch.setenv("KVLAB_API_KEY", API_KEY)
    asked, started = [], []
    prefill_ahead = WarmEngine.prefill_ahead

    def spy(self, body):
        asked.append(body)
        started.append(prefill_ahead(self, body))
        return started[-1]

    monkeypatch.setattr(WarmEngine, "prefill_ahead", spy)
    configs = (config_text({"quant": "int8"}),)
    at = open_page(PLAYGROUND, length="256", seed="31", config=list(configs))
    assert_clean(at)
    # the link's item as the script starts, then as the widgets have it: the same, prefilled once
    assert asked == [request_body(PlaygroundView(length=256, seed=31, config=configs))] * 2
    assert len([thread for thread in started if thread is not None]) == 1
    run(at)
    assert_clean(at)
    table = next(df.value for df in at.dataframe if "verdict" in df.value.columns)
    assert list(table["config"]) == ["baseline", "int8/g64/r64"]
    assert all(thread is None or thread.wait(SAFETY_S) for thread in started)


def test_the_item_shown_is_prefilled_ahead_and_its_run_prefills_nothing(kvlab_server, monkeypatch):
    """The page asks the warm server to prefill the item it shows (WarmEngine.prefill_ahead): once per body, never
    starting a server; the Run of that item then reports no prefill of its own and keeps the prefill ahead going,
    while a Run of another item cancels it (it would only delay that Run)."""
    from kvlab.dashboard.playground import request_body
    from kvlab.dashboard.warm_engine import WarmEngine

    body = request_body(PlaygroundView(length=512, seed=21, config=(config_text({"quant": "int4"}),)))
    monkeypatch.delenv("KVLAB_PLAYGROUND_URL", raising=False)
    cold = WarmEngine("smollm2-135m")
    assert cold.prefill_ahead(body) is None and not cold.started  # showing an item starts no server
    monkeypatch.setenv("KVLAB_PLAYGROUND_URL", kvlab_server[1].removesuffix("/v1"))
    monkeypatch.setenv("KVLAB_API_KEY", API_KEY)
    warm = WarmEngine("smollm2-135m")
    ahead = warm.prefill_ahead(body)
    assert ahead is not None and warm.prefill_ahead(body) is None  # once per body
    assert ahead.wait(SAFETY_S) and ahead.error is None
    assert ahead.answer is not None and ahead.answer["prefilled"]["context_tokens"] > 400
    phases: list[str] = []
    answer = warm.run(body, lambda progress: phases.append(progress["phase"]))
    assert answer is not None and [r["config"] for r in answer["results"]] == ["baseline", "int4/g64/r64"]
    assert phases and "prefill" not in phases and not ahead.cancelled
    other = warm.prefill_ahead(body | {"item": body["item"] | {"seed": 22}})
    assert other is not None
    third = body | {"item": body["item"] | {"seed": 23}}
    assert warm.run(third) is not None and other.cancelled  # a Run of a third item: the other's prefill stopped
    assert other.wait(SAFETY_S) and other.error is None
    fourth = body | {"item": body["item"] | {"seed": 24}}
    first_configs = warm.prefill_ahead(fourth)
    other_configs = warm.prefill_ahead(fourth | {"configs": [{"quant": "int8"}]})
    assert first_configs is not None and other_configs is not None
    assert not first_configs.cancelled  # the same item under other configs: the server may reuse it, so it goes on
    assert first_configs.wait(SAFETY_S) and other_configs.wait(SAFETY_S) and other_configs.answer is not None


def test_a_task_on_an_endpoint_without_tokenize_is_one_line_that_says_what_runs_there():
    """A server that lists its model but has no /tokenize (not vLLM, not kvlab serve): a task's item cannot be
    sized in its tokens, and the refusal says what can run there instead."""
    from kvlab.dashboard.endpoint_playground import run_on_endpoint
    from kvlab.dashboard.warm_engine import PlaygroundError
    from tests.serving import plain_openai_server

    with plain_openai_server() as base_url, pytest.raises(
            PlaygroundError, match=r"/tokenize answered 501: .* give a JSONL row or your own text"):
        run_on_endpoint(PlaygroundView(length=256).item(), "smollm2-135m", base_url, None)
