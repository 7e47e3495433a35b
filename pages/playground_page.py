"""Playground: one item under a few KV-cache configs, answered in seconds by a warm `kvlab serve`, each with
its answer, its measured cache and a token map of what it kept (:mod:`kvlab.dashboard.playground`).

The state is the URL's (a playground view is a share link); the model runs in the server, never in the
dashboard process (:mod:`kvlab.dashboard.warm_engine`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pandas as pd
import streamlit as st
from pydantic import ValidationError

from kvlab.core.axes import CONFIG_COLUMNS
from kvlab.core.errors import ConfigError
from kvlab.core.model_registry import KNOWN_MODELS
from kvlab.core.tasks import TASKS, generated_tasks
from kvlab.core.urls import strip_credentials
from kvlab.dashboard import formatting, page_table
from kvlab.dashboard.endpoint_playground import run_on_endpoint
from kvlab.dashboard.page_keys import TYPED_HELP, key_caption
from kvlab.dashboard.playground import (
    ENGINES,
    MAX_CONFIGS,
    NUMBER_RANGES,
    OWN_TEXT_FIELDS,
    OWN_TEXT_UNSAVED,
    SOURCES,
    PlaygroundView,
    answer_spans,
    config_text,
    empty_answer_hint,
    kept_share,
    progress_text,
    request_body,
    result_rows,
    spec_for,
    token_map_html,
    token_map_legend,
)
from kvlab.dashboard.spec_form import config_row, config_rows
from kvlab.dashboard.task_params import item_param_widgets, params_text
from kvlab.dashboard.warm_engine import BackgroundRun, WarmEngine
from kvlab.paths import DATA_DIR_VAR, data_dir
from kvlab.secrets import BASE_URL_VAR, DEFAULT_KEY_VAR, MODEL_ID_VAR, PLAYGROUND_URL_VAR, read_setting
from kvlab.tasks.data_dir import data_files
from pages.common import share_box
from pages.config_table import column_order, config_columns
from pages.task_params import item_param_inputs

#: The configs table's columns: the new-experiment form's, but a config's name (its label here).
DATA_COLUMNS = tuple(c for c in CONFIG_COLUMNS if c != "name")
#: Where the session keeps its Run in flight (:class:`BackgroundRun`), and its last answer.
RUN_KEY, ANSWER_KEY = "playground-run", "playground-answer"
#: The user's own text while it is too long for the link (this tab's session keeps it instead).
OWN_TEXT_KEY = "playground-own-text"
#: The API key typed for a Run on an endpoint (this tab's session only: never in the view, the link or a log).
TYPED_KEY = "playground-typed-key"
#: Seconds between two looks at a Run in flight; each look also waits this long for its end (so the answer is
#: drawn as soon as it comes, not up to a period later).  Each look is a script run here and a redraw in the
#: browser: at 0.25 s they took 2.2 s and 2.3 s of CPU during a 7 s Run beside a worker, at 1 s 0.85 s and
#: 1.6 s, CPU that the Run's server needs (docs/decisions.md, issue 38).
POLL_S = 1.0


@st.cache_resource(show_spinner=False)
def warm_engine(model: str) -> WarmEngine:
    """One server per model and dashboard process, shared by its sessions."""
    return WarmEngine(model)


def prefill_ahead(view: PlaygroundView) -> None:
    """The item this page shows, prefilled now by a server that is already up (:meth:`WarmEngine.prefill_ahead`):
    a new item's Run then waits for no prefill, or for what is left of it."""
    try:
        body = request_body(view)
    except ConfigError:
        return  # an item that cannot be built: Run says why
    warm_engine(view.model).prefill_ahead(body)


st.title("Playground")
st.caption("One item under a few KV-cache configs, answered in seconds by a warm `kvlab serve` that this page "
           "starts on first use: each answer with its measured cache and a map of the tokens each config kept.")

view, problems = PlaygroundView.from_params(st.query_params.to_dict() | {
    "config": st.query_params.get_all("config")} if "config" in st.query_params else st.query_params.to_dict())
for problem in problems:
    st.warning(f"The link's {formatting.md(problem)}", icon=":material/link_off:")
if view.source == "text" and not any(name in st.query_params for name in OWN_TEXT_FIELDS):
    view = replace(view, **st.session_state.get(OWN_TEXT_KEY, {}))  # a text too long for the link: the tab keeps it
# a link's item, prefilled while the page draws (a file's row is read once the widgets have it, not twice)
if view.engine == "embedded" and view.source != "file" and RUN_KEY not in st.session_state:
    prefill_ahead(view)

model_col, engine_col = st.columns([1, 2])
model = model_col.selectbox("Model", list(KNOWN_MODELS), index=list(KNOWN_MODELS).index(view.model),
                            help="The server loads it once; later Runs reuse it. On an endpoint: the model it "
                                 "serves (its geometry sizes the cache estimate).")
engine = engine_col.radio("Run on", ENGINES, index=ENGINES.index(view.engine), horizontal=True,
                          format_func={"embedded": "kvlab serve (every config, token maps)",
                                       "endpoint": "an OpenAI-compatible endpoint (vLLM, SGLang...)"}.get)
endpoint: dict[str, Any] = {}
inputs: dict[str, Any]
if engine == "endpoint":
    url_col, id_col = st.columns(2)
    endpoint = {
        "base_url": strip_credentials(url_col.text_input(
            "Base URL", value=view.base_url, placeholder="http://127.0.0.1:8000/v1",
            help=f"Blank: {BASE_URL_VAR} from the environment or .streamlit/secrets.toml. {DEFAULT_KEY_VAR} "
                 f"goes only to the URL in {BASE_URL_VAR} (or {PLAYGROUND_URL_VAR}); elsewhere, type a key "
                 "below.").strip()),
        "model_id": id_col.text_input("Model id", value=view.model_id,
                                      help=f"Blank: {MODEL_ID_VAR}, else the only model the server lists").strip()}
    # the key: never in the view (nor the link); the dashboard's own only where it belongs (page_keys)
    typed_key = st.text_input("API key (optional)", type="password", key=TYPED_KEY, help=TYPED_HELP)
    if target := endpoint["base_url"] or read_setting(BASE_URL_VAR)[0]:
        st.caption(key_caption(DEFAULT_KEY_VAR, target, typed_key))
    st.caption("The endpoint decides its own KV cache (its launch flags): the item runs once, as it stores it, with "
               "its answer, timings and the cache it held (an estimate). The configs below run on kvlab serve; which "
               "tokens a cache kept only the embedded engine can show.")
source = st.radio("Input", SOURCES, index=SOURCES.index(view.source), horizontal=True,
                  format_func={"task": "an item of a task", "file": "a row of a JSONL file",
                               "text": "my own text"}.get)
if source == "task":
    tasks = generated_tasks()
    task_col, length_col, depth_col, seed_col = st.columns(4)
    task = task_col.selectbox("Task", tasks, index=tasks.index(view.task) if view.task in tasks else 0)
    length = length_col.number_input("Context (tokens)", *NUMBER_RANGES["length"], step=128, value=view.length)
    depth = depth_col.number_input("Needle depth", *NUMBER_RANGES["depth"], step=0.1, value=view.depth,
                                   disabled=not TASKS[task].needle_depths, help="Where the task hides what it asks for")
    seed = seed_col.number_input("Seed", *NUMBER_RANGES["seed"], step=1, value=view.seed)
    # the task's own parameters that shape one item, a widget each from its parameter model
    widgets = item_param_widgets(TASKS[task].params)
    own = item_param_inputs(widgets, f"playground-{task}-", view.task_param_values() if task == view.task else {})
    inputs = {"task": task, "length": int(length), "depth": float(depth), "seed": int(seed),
              "task_params": params_text(widgets, own)}
elif source == "file":
    files = list(dict.fromkeys([*([view.file] if view.file else []), *data_files()]))
    file_col, row_col = st.columns([3, 1])
    file = file_col.selectbox("File (under the data directory)", files, index=0 if files else None,
                              help=f"The JSONL files under {data_dir()} ({DATA_DIR_VAR}); New experiment's jsonl "
                                   "task uploads one there.")
    row = row_col.number_input("Row", *NUMBER_RANGES["row"], step=1, value=view.row, help="1 is the file's first item")
    inputs = {"file": file or "", "row": int(row)}
    if not files:
        st.info(f"No JSONL file under the data directory {data_dir()} ({DATA_DIR_VAR}): put one there, or upload "
                "one in New experiment (task jsonl).", icon=":material/folder_open:")
    else:
        try:
            shown = PlaygroundView(source="file", **inputs).item()
        except ConfigError as error:
            st.error(formatting.md(str(error)), icon=":material/error:")
        else:
            st.caption(f"Question: {formatting.md(shown['question'].strip()[:300])} · expected: "
                       f"{formatting.md(shown['answer'][:100])} · context: {len(shown['context']):,} characters")
else:
    inputs = {"context": st.text_area("Context (compressed)", value=view.context, height=180)}
    question_col, answer_col, tokens_col = st.columns([3, 2, 1])
    inputs |= {"question": question_col.text_input("Question (fed after the compressed context)",
                                                   value=view.question),
               "answer": answer_col.text_input("Expected answer (optional: marks the answer right or wrong)",
                                               value=view.answer),
               "max_new_tokens": int(tokens_col.number_input(
                   "Max new tokens", *NUMBER_RANGES["max_new_tokens"], step=8, value=view.max_new_tokens,
                   help="The most tokens each answer may take (fewer when the model ends it)"))}

st.subheader("Configs")
st.caption(f"Up to {MAX_CONFIGS}, each a row (the baseline always runs too). `kvlab methods` lists the methods and "
           "the budgets each takes.")
table = pd.DataFrame(config_rows(view.configs()), columns=list(DATA_COLUMNS))
edited = st.data_editor(
    table.astype({"skipped_layers": "string"}), key="playground-configs", num_rows="dynamic",
    hide_index=True, column_order=column_order(with_name=False), width="stretch", column_config=config_columns())
rows = [row for row in (config_row(r) for r in edited.to_dict("records")) if row is not None]
if len(rows) > MAX_CONFIGS:
    st.error(f"{len(rows)} configs: the playground compares at most {MAX_CONFIGS} at once", icon=":material/error:")
    st.stop()
configs = []
for number, edited_row in enumerate(rows, start=1):
    try:
        configs.append(config_text(edited_row))
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(map(str, first["loc"]))
        st.error(f"Config row {number}{': ' + where if where else ''}: "
                 f"{formatting.md(first['msg'].removeprefix('Value error, '))}", icon=":material/error:")
        st.stop()

view = PlaygroundView(model=model, engine=engine, source=source, config=tuple(configs), **endpoint, **inputs)
link, left_out = view.link()
st.query_params.from_dict(link)
share_box(link)
if left_out:
    st.session_state[OWN_TEXT_KEY] = {name: getattr(view, name) for name in OWN_TEXT_FIELDS}
    st.sidebar.caption(formatting.md(left_out))
else:
    st.session_state.pop(OWN_TEXT_KEY, None)



def start_run(view: PlaygroundView) -> None:
    """Run's callback: the Run in a thread of its own (:class:`BackgroundRun`), unless one is in flight (a second
    click queues nothing)."""
    job = st.session_state.get(RUN_KEY)
    if job is not None and not job.done:
        return
    key = json.dumps(view.params(), sort_keys=True)
    try:
        if view.engine == "endpoint":
            fields = view.item()  # a file's row is read here, and its error said at once
            typed_key = str(st.session_state.get(TYPED_KEY) or "")
            job = BackgroundRun(lambda report, cancelled: run_on_endpoint(fields, view.model, view.base_url,
                                                                          view.model_id, typed_key=typed_key), key)
        else:
            body, warm = request_body(view), warm_engine(view.model)

            def work(report: Callable[[dict[str, Any]], None], cancelled: Callable[[], bool]) -> dict[str, Any] | None:
                if not warm.started:
                    report({"phase": "starting"})
                    warm.start()
                return None if cancelled() else warm.run(body, report, cancelled)

            job = BackgroundRun(work, key)
    except ConfigError as error:
        st.session_state[ANSWER_KEY] = (key, None, str(error))
        return
    st.session_state[RUN_KEY] = job


@st.fragment(run_every=POLL_S)
def in_flight(model: str) -> None:
    """The Run in flight: its progress and Cancel, looked at every :data:`POLL_S`; once it is done, the whole page
    again (its answer drawn, Run enabled)."""
    job: BackgroundRun | None = st.session_state.get(RUN_KEY)
    if job is None or job.cancelled or job.wait(POLL_S):
        st.rerun()
    text, share = progress_text(job.progress, model)
    st.progress(share, text=formatting.md(text))
    st.button("Cancel", icon=":material/stop:", key="cancel", on_click=job.cancel,
              help="Stops the Run: kvlab serve stops within one layer of the model (an endpoint finishes the "
                   "request it has, unread)")


job: BackgroundRun | None = st.session_state.get(RUN_KEY)
if job is not None and (job.done or job.cancelled):  # its answer (or its error) becomes the page's
    st.session_state[ANSWER_KEY] = (job.key, job.answer, "cancelled" if job.cancelled else job.error)
    del st.session_state[RUN_KEY]
    job = None
running = job is not None
if view.engine == "embedded" and not running:  # the item as the widgets have it
    prefill_ahead(view)
run_col, save_col = st.columns([1, 1])
run_col.button("Run", type="primary", icon=":material/play_arrow:", key="run", disabled=running,
               on_click=start_run, args=(view,), help="A Run in flight: wait for it, or Cancel it" if running else None)
if save_col.button("Save as experiment", icon=":material/save:", key="save", disabled=view.source == "text",
                   help=OWN_TEXT_UNSAVED if view.source == "text" else None):
    try:
        st.session_state["playground_spec"] = spec_for(view)
    except ValueError as error:
        st.error(formatting.md(str(error)), icon=":material/error:")
    else:
        st.switch_page(page_table.NEW.script)

if running:
    in_flight(model)
    st.stop()
stored = st.session_state.get(ANSWER_KEY)
if stored is None:
    st.stop()
key, answer, problem = stored
if problem == "cancelled":
    st.info("The Run was cancelled.", icon=":material/stop:")
    st.stop()
if problem is not None or answer is None:
    st.error(formatting.md(problem or "the Run gave no answer"), icon=":material/error:")
    st.stop()
if key != json.dumps(view.params(), sort_keys=True):
    st.caption("These answers are from an earlier Run (the input, the configs, the model or the engine changed "
               "since).")
item = answer["item"]
st.dataframe(result_rows(answer), hide_index=True, key="playground-results")
if view.source == "text" and (hint := empty_answer_hint(answer, view.max_new_tokens)):
    st.info(formatting.md(hint), icon=":material/help:")
outlines = answer_spans(item)
if answer["results"][0]["kept_positions"] is None:  # an endpoint's answer
    only = answer["results"][0]
    st.markdown(f"**{formatting.md(only['config'])}**"
                + ("" if only["score"] is None else (" (right)" if only["score"] >= 1 else " (wrong)"))
                + f": {formatting.md(only['generated'].strip()[:200])}")
    st.caption(f"KV cache: {formatting.md(only['kv_source'])}. Token maps need the embedded engine: run on kvlab "
               "serve to see which tokens each config kept.")
    st.stop()
layers = len(answer["results"][0]["kept_positions"]["layers"])
layer = st.selectbox("Token map of", ["every layer", *(f"layer {i}" for i in range(layers))], key="layer",
                     help="Shaded by the share of KV heads that kept each token (of every layer, or of one).")
chosen = None if layer == "every layer" else int(layer.split()[1])
st.html(token_map_legend())
if item.get("answer") and not outlines:
    st.caption("The expected answer does not occur in the context as written: nothing is outlined.")
for index, result in enumerate(answer["results"]):
    verdict = "" if result["score"] is None else (" (right)" if result["score"] >= 1 else " (wrong)")
    st.markdown(f"**{formatting.md(result['config'])}**{verdict}: {formatting.md(result['generated'].strip()[:200])}")
    st.html(token_map_html(item["context"], answer["context_offsets"], kept_share(result, chosen), outlines, index),
            unsafe_allow_javascript=True)
