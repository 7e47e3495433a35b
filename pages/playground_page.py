"""Playground: one item under a few KV-cache configs, answered in seconds by a warm `kvlab serve`, each with
its answer, its measured cache and a token map of what it kept (:mod:`kvlab.dashboard.playground`).

The state is the URL's (a playground view is a share link); the model runs in the server, never in the
dashboard process (:mod:`kvlab.dashboard.warm_engine`).
"""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st
from pydantic import ValidationError

from kvlab.core.axes import CONFIG_COLUMNS
from kvlab.core.errors import ConfigError
from kvlab.core.model_registry import KNOWN_MODELS
from kvlab.core.tasks import TASKS, generated_tasks
from kvlab.core.urls import strip_credentials
from kvlab.dashboard import page_table, views
from kvlab.dashboard.endpoint_playground import run_on_endpoint
from kvlab.dashboard.playground import (
    ENGINES,
    MAX_CONFIGS,
    SOURCES,
    PlaygroundView,
    answer_span,
    config_text,
    kept_share,
    request_body,
    result_rows,
    spec_for,
    token_map_html,
)
from kvlab.dashboard.spec_form import config_row, config_rows
from kvlab.dashboard.task_params import item_param_widgets, params_text
from kvlab.dashboard.warm_engine import PlaygroundError, WarmEngine
from kvlab.paths import DATA_DIR_VAR, data_dir
from kvlab.secrets import BASE_URL_VAR, DEFAULT_KEY_VAR, MODEL_ID_VAR
from kvlab.tasks.data_dir import data_files
from pages.common import share_box
from pages.config_table import config_columns
from pages.task_params import item_param_inputs

#: The configs table's columns: the new-experiment form's, but a config's name (its label here).
DATA_COLUMNS = tuple(c for c in CONFIG_COLUMNS if c != "name")


@st.cache_resource(show_spinner=False)
def warm_engine(model: str) -> WarmEngine:
    """One server per model and dashboard process, shared by its sessions."""
    return WarmEngine(model)


st.title("Playground")
st.caption("One item under a few KV-cache configs, answered in seconds by a warm `kvlab serve` that this page "
           "starts on first use: each answer with its measured cache and a map of the tokens each config kept.")

view, problems = PlaygroundView.from_params(st.query_params.to_dict() | {
    "config": st.query_params.get_all("config")} if "config" in st.query_params else st.query_params.to_dict())
for problem in problems:
    st.warning(f"The link's {views.md(problem)}", icon=":material/link_off:")

model_col, engine_col = st.columns([1, 2])
model = model_col.selectbox("Model", list(KNOWN_MODELS), index=list(KNOWN_MODELS).index(view.model),
                            help="The server loads it once; later Runs reuse it. On an endpoint: the model it "
                                 "serves (its geometry sizes the cache estimate).")
engine = engine_col.radio("Run on", ENGINES, index=ENGINES.index(view.engine), horizontal=True,
                          format_func={"embedded": "kvlab serve (every config, token maps)",
                                       "endpoint": "an OpenAI-compatible endpoint (vLLM, SGLang...)"}.get)
endpoint: dict[str, str] = {}
if engine == "endpoint":
    url_col, id_col = st.columns(2)
    endpoint = {
        "base_url": strip_credentials(url_col.text_input(
            "Base URL", value=view.base_url, placeholder="http://127.0.0.1:8000/v1",
            help=f"Blank: {BASE_URL_VAR} from the environment or .streamlit/secrets.toml. The key is read from "
                 f"{DEFAULT_KEY_VAR} there, never typed here.").strip()),
        "model_id": id_col.text_input("Model id", value=view.model_id,
                                      help=f"Blank: {MODEL_ID_VAR}, else the only model the server lists").strip()}
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
    length = length_col.number_input("Context (tokens)", min_value=64, max_value=8192, step=128, value=view.length)
    depth = depth_col.number_input("Needle depth", min_value=0.0, max_value=1.0, step=0.1, value=view.depth,
                                   disabled=not TASKS[task].needle_depths, help="Where the task hides what it asks for")
    seed = seed_col.number_input("Seed", min_value=0, step=1, value=view.seed)
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
    row = row_col.number_input("Row", min_value=1, step=1, value=view.row, help="1 is the file's first item")
    inputs = {"file": file or "", "row": int(row)}
    if not files:
        st.info(f"No JSONL file under the data directory {data_dir()} ({DATA_DIR_VAR}): put one there, or upload "
                "one in New experiment (task jsonl).", icon=":material/folder_open:")
    else:
        try:
            shown = PlaygroundView(source="file", **inputs).item()
        except ConfigError as error:
            st.error(views.md(str(error)), icon=":material/error:")
        else:
            st.caption(f"Question: {views.md(shown['question'].strip()[:300])} · expected: "
                       f"{views.md(shown['answer'][:100])} · context: {len(shown['context']):,} characters")
else:
    inputs = {"context": st.text_area("Context (compressed)", value=view.context, height=180),
              "question": st.text_input("Question (fed after the compressed context)", value=view.question),
              "answer": st.text_input("Expected answer (optional: marks the answer right or wrong)",
                                      value=view.answer)}

st.subheader("Configs")
st.caption(f"Up to {MAX_CONFIGS}, each a row (the baseline always runs too). `kvlab methods` lists the methods and "
           "the budgets each takes.")
table = pd.DataFrame(config_rows(view.configs()), columns=list(DATA_COLUMNS))
edited = st.data_editor(
    table.astype({"skipped_layers": "string"}), key="playground-configs", num_rows="dynamic",
    hide_index=True, column_order=DATA_COLUMNS, width="stretch", column_config=config_columns())
rows = [row for row in (config_row(r) for r in edited.to_dict("records")) if row is not None]
if len(rows) > MAX_CONFIGS:
    st.error(f"{len(rows)} configs: the playground compares at most {MAX_CONFIGS} at once", icon=":material/error:")
    st.stop()
configs = []
for number, row in enumerate(rows, start=1):
    try:
        configs.append(config_text(row))
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(map(str, first["loc"]))
        st.error(f"Config row {number}{': ' + where if where else ''}: "
                 f"{views.md(first['msg'].removeprefix('Value error, '))}", icon=":material/error:")
        st.stop()

view = PlaygroundView(model=model, engine=engine, source=source, config=tuple(configs), **endpoint, **inputs)
st.query_params.from_dict(view.params())
share_box(view.params())

run_col, save_col = st.columns([1, 1])
if run_col.button("Run", type="primary", icon=":material/play_arrow:", key="run"):
    try:
        if engine == "endpoint":
            with st.spinner(f"Running on {view.base_url or 'the endpoint'}..."):
                answer = run_on_endpoint(view.item(), model, view.base_url, view.model_id)
        else:
            warm = warm_engine(model)
            if not warm.started:
                with st.status(f"Starting `kvlab serve` for {model} (loading the model: the first Run only)..."
                               ) as status:
                    warm.start()
                    status.update(label="The server is ready.", state="complete")
            with st.spinner("Running..."):
                answer = warm.run(request_body(view))
        st.session_state["playground-answer"] = (json.dumps(view.params(), sort_keys=True), answer)
    except (PlaygroundError, ConfigError) as error:
        st.error(views.md(str(error)), icon=":material/error:")
if save_col.button("Save as experiment", icon=":material/save:", key="save"):
    try:
        st.session_state["playground_spec"] = spec_for(view)
    except ValueError as error:
        st.error(views.md(str(error)), icon=":material/error:")
    else:
        st.switch_page(page_table.NEW.script)

stored = st.session_state.get("playground-answer")
if stored is not None:
    key, answer = stored
    if key != json.dumps(view.params(), sort_keys=True):
        st.caption("These answers are from an earlier Run (the input, the configs, the model or the engine changed "
                   "since).")
    item = answer["item"]
    st.dataframe(result_rows(answer), hide_index=True, key="playground-results")
    outline = answer_span(item)
    if answer["results"][0]["kept_positions"] is None:  # an endpoint's answer
        only = answer["results"][0]
        st.markdown(f"**{views.md(only['config'])}**"
                    + ("" if only["score"] is None else (" (right)" if only["score"] >= 1 else " (wrong)"))
                    + f": {views.md(only['generated'].strip()[:200])}")
        st.caption(f"KV cache: {views.md(only['kv_source'])}. Token maps need the embedded engine: run on kvlab "
                   "serve to see which tokens each config kept.")
        st.stop()
    layers = len(answer["results"][0]["kept_positions"]["layers"])
    layer = st.selectbox("Token map of", ["every layer", *(f"layer {i}" for i in range(layers))], key="layer",
                         help="Shaded by the share of KV heads that kept each token (of every layer, or of one).")
    chosen = None if layer == "every layer" else int(layer.split()[1])
    st.caption("Blue: kept by that share of heads; white: evicted by all of them"
               + ("; the expected answer is boxed in red." if outline else "."))
    for result in answer["results"]:
        verdict = "" if result["score"] is None else (" (right)" if result["score"] >= 1 else " (wrong)")
        st.markdown(f"**{views.md(result['config'])}**{verdict}: {views.md(result['generated'].strip()[:200])}")
        share = kept_share(result, chosen)
        st.html(token_map_html(item["context"], answer["context_offsets"], share, outline))
