"""New experiment: build a spec (model, backend, tasks, configs, sweep grid), see what it will cost,
launch it on local workers; or load / upload / download it as TOML.

Every widget's key is the spec field it sets (prefixed ``f:``), so kvlab's validation messages are
placed next to the widget they are about (``kvlab.dashboard.spec_form.assign_errors``).
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import pandas as pd
import streamlit as st

from kvlab.core.axes import CONFIG_COLUMNS
from kvlab.core.backends import BACKENDS
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ExperimentSpec, dump_spec, parse_spec, spec_text
from kvlab.core.margin_inputs import MARGIN_FORMAT, MARGIN_INPUTS
from kvlab.core.methods import BUDGETS
from kvlab.core.tasks import DEFAULT_NUM_ITEMS, TASKS
from kvlab.dashboard import estimate, executor_form, formatting, page_table
from kvlab.dashboard.launch import Refused, launch_sweep
from kvlab.dashboard.spec_form import (
    MODES,
    SpecForm,
    assign_errors,
    build_spec,
    default_form,
    empty_task_values,
    form_from_spec,
    key_line,
    list_examples,
    named_rows,
)
from kvlab.dashboard.task_params import ParamWidget, param_widgets
from kvlab.engines.servers import SERVERS
from kvlab.models import KNOWN_MODELS
from kvlab.paths import DATA_DIR_VAR, data_dir
from kvlab.secrets import BASE_URL_VAR, MODEL_ID_VAR
from kvlab.spec_files import load_spec, parse_spec_toml
from kvlab.tasks.data_dir import UPLOADS, save_upload
from kvlab.tasks.jsonl import DEFAULT_FILE_MB, FILE_MB_VAR
from pages import tune_form
from pages.capacity_preview import capacity_preview
from pages.common import get_store, share_box
from pages.config_table import column_order, config_columns
from pages.executor_choice import executor_choice
from pages.grid_inputs import grid_inputs
from pages.task_params import form_param_inputs

P = "f:"  # widget keys: P + spec field path
TASK_NAMES: tuple[str, ...] = tuple(TASKS)
EXAMPLE_TO_LAUNCH = "tiny"
LOCAL_EXECUTOR = executor_form.Executor()  # launch's default: local workers (a frozen value)

store = get_store()


def load_form(form: SpecForm) -> None:
    """Fill every widget from ``form`` (run before the widgets are drawn: in a callback or at the top)."""
    for key in [k for k in st.session_state if isinstance(k, str) and k.startswith(P)]:
        del st.session_state[key]
    for key, value in form.values.items():
        st.session_state[P + key] = value
    st.session_state["form_n_tasks"] = form.n_tasks
    st.session_state["form_configs"] = st.session_state["form_configs_seen"] = form.configs
    st.session_state["form_values"] = dict(form.values)
    st.session_state["form_base"] = form.base
    st.session_state["form_version"] = st.session_state.get("form_version", 0) + 1


def on_upload() -> None:
    upload = st.session_state.get("spec_upload")
    if upload is None:
        return
    try:
        spec, warnings = parse_spec_toml(spec_text(upload.getvalue(), upload.name), upload.name)
    except ConfigError as error:
        st.session_state["form_flash"] = [("error", f"Not loaded: {error}")]
        return
    load_form(form_from_spec(spec))
    st.session_state["form_warnings"] = warnings
    st.session_state["form_flash"] = [("ok", f"Loaded {upload.name}.")] + [("warning", w) for w in warnings]


def on_example() -> None:
    name = st.session_state["example_pick"]
    try:
        spec, warnings = load_spec(list_examples()[name])
    except ConfigError as error:
        st.session_state["form_flash"] = [("error", f"example {name}: {error}")]
        return
    load_form(form_from_spec(spec))
    st.session_state["form_warnings"] = warnings
    st.session_state["form_flash"] = [("ok", f"Loaded the example '{name}'.")]


def add_task() -> None:
    index = st.session_state["form_n_tasks"]
    for key, value in empty_task_values(index).items():
        st.session_state[P + key] = value
    st.session_state["form_n_tasks"] = index + 1


def remove_task(index: int) -> None:
    """Shift the later tasks' widget values down one place."""
    count = st.session_state["form_n_tasks"]
    sections = [f"{P}tasks.{i}." for i in range(index, count)]  # tasks differ in their parameters' widgets
    suffixes = {k.removeprefix(s) for k in list(st.session_state) for s in sections
                if isinstance(k, str) and k.startswith(s)}
    for later in range(index + 1, count):
        for suffix in suffixes:
            if f"{P}tasks.{later}.{suffix}" in st.session_state:
                st.session_state[f"{P}tasks.{later - 1}.{suffix}"] = st.session_state[f"{P}tasks.{later}.{suffix}"]
            else:
                st.session_state.pop(f"{P}tasks.{later - 1}.{suffix}", None)
    for suffix in suffixes:
        st.session_state.pop(f"{P}tasks.{count - 1}.{suffix}", None)
    base = dict(st.session_state["form_base"])
    base["tasks"] = [t for i, t in enumerate(base.get("tasks", [])) if i != index]
    st.session_state["form_base"] = base
    st.session_state["form_n_tasks"] = count - 1


def launch(spec: ExperimentSpec, workers: int, warnings: list[str],
           executor: executor_form.Executor = LOCAL_EXECUTOR) -> None:
    try:
        experiment_id = launch_sweep(spec, warnings, executor, workers)
    except Refused as refused:  # nothing stored: the spec cannot run (a file outside the data directory...)
        st.error(formatting.md(str(refused)), icon=":material/error:")
        return
    st.switch_page(page_table.EXPERIMENT.script, query_params={"id": str(experiment_id)})


@st.cache_data(ttl=300, show_spinner=False)
def past_rates(model: str, db: str | None) -> estimate.Rates | None:
    """Timing rates from the newest finished experiment of ``model`` (``db`` keys the cache)."""
    for record in get_store().list_experiments(status="done", search=model, limit=20):
        if record.model == model and record.items_done:
            rates = estimate.rates_from_results(get_store().item_results(record.id),
                                                f"past results of experiment #{record.id} ({model})")
            if rates is not None:
                return rates
    return None


if (from_playground := st.session_state.pop("playground_spec", None)) is not None:  # "Save as experiment"
    load_form(form_from_spec(parse_spec(from_playground)))
    st.session_state["form_flash"] = [("ok", "Loaded the playground's endpoint, to run its own cache on the whole "
                                             "task (the configs need kvlab serve): check the task and launch."
                                       if from_playground.get("backend") else
                                       "Loaded the playground's configs, to run on the whole task: check the "
                                       "task and launch.")]
elif "form_n_tasks" not in st.session_state:
    load_form(default_form())
else:  # back from another page: Streamlit dropped the widgets' values, the mirror kept them
    for key, value in st.session_state["form_values"].items():
        st.session_state.setdefault(P + key, value)
    if f"configs_editor_{st.session_state['form_version']}" not in st.session_state:
        st.session_state["form_configs"] = st.session_state["form_configs_seen"]

st.title("New experiment")
share_box({})
for kind, text in st.session_state.pop("form_flash", []):
    {"ok": st.success, "warning": st.warning, "error": st.error}[kind](text)

with st.container(border=True):
    st.markdown("**New here?** Launch the tiny example sweep (3 configs, 2 passkey items at 256 tokens, "
                "under a minute on 2 CPU cores: 28 s measured) and watch it run.")
    if st.button("Launch the tiny example", type="primary", icon=":material/rocket_launch:", key="launch_example"):
        tiny, _ = load_spec(list_examples()[EXAMPLE_TO_LAUNCH])
        launch(tiny, 1, [])

start_col, upload_col = st.columns(2)
with start_col:
    examples = list(list_examples())
    st.selectbox("Start from an example", examples, key="example_pick")
    st.button("Load example into the form", on_click=on_example, key="load_example")
with upload_col:
    st.file_uploader("…or upload a spec (TOML)", type=["toml"], key="spec_upload", on_change=on_upload,
                     help="A kvlab spec, or a seed-blog shaped one ([server] / [kv_cache]); it replaces the form.")

slots: dict[str, Any] = {}


def backend_options(backend: str) -> None:
    """Endpoint or server settings.  The key is never typed here: it is read from the environment or
    .streamlit/secrets.toml when the experiment runs; this only says whether it would be sent, and where
    (a run aimed anywhere else is refused at Launch: :class:`kvlab.experiments.submit.PageLimits`)."""
    with st.container(border=True):
        if "base_url" in BACKENDS[backend].fields:
            url_col, model_col = st.columns(2)
            with url_col:
                st.text_input("Base URL", key=P + "backend.base_url", placeholder="http://127.0.0.1:8000/v1",
                              help=f"Blank: {BASE_URL_VAR} from the environment or .streamlit/secrets.toml")
                slot("backend.base_url")
            model_col.text_input("Model id", key=P + "backend.model_id",
                                 help=f"Blank: {MODEL_ID_VAR}, else the only model the server lists")
            st.caption("An endpoint decides its own KV cache: against it only the baseline runs, except against "
                       "`kvlab serve`, which applies each config per request.")
        else:
            model_col, python_col = st.columns(2)
            model_col.text_input("Served model name", key=P + "backend.model_id",
                                 help="Blank: the model above. The model must be loadable on the host that runs "
                                      "the workers (a Hugging Face id or local path).")
            engine = SERVERS[backend]
            form, flags = engine.form, engine.setting_flags  # the engine's own names for kvlab's server settings
            python_col.text_input("Python with the engine installed", key=P + "backend.server.python",
                                  help=form.python_help)
            fraction_col, pool_col, length_col, prefix_col = st.columns(4)
            in_tokens = f"{engine.title} sizes its pool in tokens: the max model length"
            memory_flag = flags.get("memory_fraction")
            fraction_col.number_input(
                "GPU memory fraction (0: engine default)", min_value=0.0, max_value=1.0, step=0.05,
                key=P + "backend.server.memory_fraction", disabled=memory_flag is None,
                help=memory_flag or in_tokens)
            pool_col.number_input(
                "KV pool GiB (0: default)", min_value=0.0, max_value=4096.0, step=0.5,
                key=P + "backend.server.kv_cache_gib", disabled=form.pool_help is None,
                help=form.pool_help or (f"{engine.title} sizes its pool by the memory fraction only"
                                        if memory_flag else in_tokens))
            length_col.number_input("Max model length (0: engine default)", min_value=0, step=1024,
                                    key=P + "backend.server.max_model_len", help=flags.get("max_model_len"))
            prefix_col.checkbox(form.prefix_cache, key=P + "backend.server.prefix_cache")
            st.caption(f"kvlab launches one {backend} server per config on the worker's host. {backend} stores "
                       f"KV as quant = {', '.join(engine.kv_dtypes)} and evicts no tokens: other configs "
                       "are refused.")
            slot("backend.server")
        key_col, concurrency_col = st.columns(2)
        with key_col:
            st.text_input("API key variable", key=P + "backend.api_key_env",
                          help="The NAME of the variable (environment or secrets.toml) holding the key: "
                               "<NAME>_API_KEY, whose key goes only to the endpoint in <NAME>_BASE_URL")
            st.caption(key_line(backend, str(st.session_state.get(P + "backend.api_key_env") or ""),
                                str(st.session_state.get(P + "backend.base_url") or "")))
        with concurrency_col:
            st.number_input("Concurrent requests", min_value=1, max_value=256, step=1,
                            key=P + "backend.max_concurrency")
        slot("backend")
        st.page_link(page_table.DOCTOR.script, label="Check an endpoint (doctor)",
                     icon=":material/stethoscope:")


def on_jsonl_upload(index: int, key: str) -> None:
    """Save an uploaded JSONL file under the data directory and point the task's file widget (``key``) at it."""
    upload = st.session_state.get(f"jsonl_upload_{index}")
    if upload is None:
        return
    try:
        saved = save_upload(upload.name, upload.getvalue())
    except ConfigError as error:
        st.session_state[f"jsonl_upload_error_{index}"] = str(error)
        return
    st.session_state.pop(f"jsonl_upload_error_{index}", None)
    st.session_state[key] = saved


def jsonl_field(index: int, key: str, widget: ParamWidget) -> None:
    """A task's file (its parameter of kind "file", under ``key``): a path under the data directory, or an
    upload saved there. Nothing else on this host can be read from a web page."""
    root = data_dir()
    st.text_input(f"{widget.label} (under the data directory)", key=key,
                  help=f"{widget.help} Here: a path relative to {root} ({DATA_DIR_VAR}), or upload a file below.")
    st.file_uploader("…or upload a JSONL file", type=["jsonl"], key=f"jsonl_upload_{index}",
                     on_change=on_jsonl_upload, args=(index, key),
                     help=f"Saved under {root / UPLOADS}. Size limit: {FILE_MB_VAR} MiB (default {DEFAULT_FILE_MB:g}).")
    if problem := st.session_state.get(f"jsonl_upload_error_{index}"):
        st.error(problem, icon=":material/error:")


def slot(key: str) -> None:
    """A place under a widget for the validation messages about its field."""
    slots[key] = st.empty()


st.header("Model and backend")
name_col, model_col, seed_col = st.columns([2, 2, 1])
with name_col:
    st.text_input("Name", key=P + "name")
    slot("name")
with model_col:
    loaded = st.session_state.get(P + "model")
    models = list(dict.fromkeys([*KNOWN_MODELS, *([loaded] if loaded else [])]))  # a loaded path is an option too
    st.selectbox("Model", models, key=P + "model", accept_new_options=True,
                 help="A registry name, or type a local HF directory or a .gguf file path.")
    slot("model")
with seed_col:
    st.number_input("Seed", min_value=0, step=1, key=P + "seed")
    slot("seed")
backend_col, device_col, tags_col = st.columns([2, 1, 3])
with backend_col:
    backend = st.selectbox("Backend", tuple(BACKENDS), key=P + "backend.kind",
                           format_func=lambda kind: BACKENDS[kind].title)
    st.caption(BACKENDS[backend].description)
    slot("backend")
with device_col:
    st.selectbox("Device", ["auto", "cpu", "cuda"], key=P + "backend.device",
                 disabled="device" not in BACKENDS[backend].fields,
                 help="The embedded engine's device; servers choose their own.")
with tags_col:
    st.text_input("Tags (comma-separated)", key=P + "tags")
    slot("tags")
for column, margin in zip(st.columns(len(MARGIN_INPUTS)), MARGIN_INPUTS.values(), strict=True):
    with column:  # the sweet-spot rule's margins, a sweep's and a tune's: the spec's fields
        st.number_input(margin.label, min_value=margin.form_low, max_value=margin.form_high, step=margin.step,
                        format=MARGIN_FORMAT, key=P + margin.name, help=margin.help)
        slot(margin.name)
if not BACKENDS[backend].loads_model_here:
    backend_options(backend)

st.header("Tasks")
for index in range(st.session_state["form_n_tasks"]):
    t = f"tasks.{index}."
    with st.container(border=True):
        name_col, lengths_col, items_col, tokens_col = st.columns([1.3, 2, 1, 1.2])
        with name_col:
            task_name = st.selectbox("Task", TASK_NAMES, key=P + t + "name")
            slot(t + "name")
        with lengths_col:
            st.text_input("Context lengths (tokens)", key=P + t + "context_lengths",
                          help="Comma-separated, each 128..131072, e.g. 1024, 2048")
            slot(t + "context_lengths")
        with items_col:
            st.number_input("Items per length", min_value=0, step=1, key=P + t + "num_items",
                            help=f"0: the default, {DEFAULT_NUM_ITEMS} per length, and every line of a JSONL file")
            slot(t + "num_items")
        with tokens_col:
            st.number_input("Max new tokens (0: task default)", min_value=0, step=1, key=P + t + "max_new_tokens")
            slot(t + "max_new_tokens")
        # the task's own parameters, a widget each from its parameter model
        form_param_inputs(param_widgets(TASKS[task_name].params), P, t, slot,
                          partial(jsonl_field, index))
        slot(f"tasks.{index}")
        if st.session_state["form_n_tasks"] > 1:
            st.button("Remove this task", key=f"remove-task-{index}", on_click=remove_task, args=(index,))
st.button("Add a task", on_click=add_task, icon=":material/add:")
slot("tasks")

mode = st.segmented_control("Mode", MODES, key=P + "mode", required=True,
                            help="Sweep: run the configs listed (and a grid). Tune: search a space for the "
                                 "sweet spot, stopping clear losers early (`kvlab tune`).")
if mode == MODES[1]:
    st.header("Tune: search space, constraints, budget")
    tune_form.fields(P, slot)
    edited = pd.DataFrame(st.session_state["form_configs_seen"])  # the configs table waits for Sweep mode
else:
    st.header("KV-cache configs")
    st.caption("The baseline (no quantization, no eviction) always runs first. Eviction needs exactly one budget: "
               + "; ".join(f"**{kind.title}** = {kind.help}" for kind in BUDGETS.values())
               + ". Quantization stores what is kept.")
    table = pd.DataFrame(named_rows(st.session_state["form_configs"]), columns=list(dict.fromkeys(
        [*CONFIG_COLUMNS, *(k for row in st.session_state["form_configs"] for k in row)])))
    edited = st.data_editor(
        table.astype({"skipped_layers": "string"}),  # a text column: an empty one would be read as numbers
        key=f"configs_editor_{st.session_state['form_version']}", num_rows="dynamic", hide_index=True,
        column_order=column_order(), width="stretch",
        column_config=config_columns())
    slot("configs")

    st.header("Sweep grid")
    sweep_on = st.toggle("Add a grid: every quantization x every eviction method x every ratio", key=P + "sweep.on")
    if sweep_on:
        grid_inputs("sweep", P, slot, st.session_state["form_base"].get("sweep") or {})
    slot("sweep")

values = {k.removeprefix(P): v for k, v in st.session_state.items() if isinstance(k, str) and k.startswith(P)}
st.session_state["form_values"] = values
st.session_state["form_configs_seen"] = edited.to_dict("records")
result = build_spec(values, st.session_state["form_n_tasks"], st.session_state["form_configs_seen"],
                    st.session_state["form_base"])
placed, general = assign_errors(result.errors, list(slots))
for key, messages in placed.items():
    slots[key].error("\n\n".join(messages), icon=":material/error:")

st.header("Preview and launch")
if result.spec is None:
    st.error("Fix the fields marked above to see the cost and launch."
             + ("\n\n" + "\n\n".join(general) if general else ""), icon=":material/error:")
elif mode == MODES[1]:
    tune_form.preview(result.spec)
    tune_form.launch_row(result.spec, store, lambda experiment_id: st.switch_page(
        page_table.TUNE.script, query_params={"id": str(experiment_id)}))
else:
    spec = result.spec
    configs = spec.all_configs()
    items = estimate.items_per_config(spec)
    rates = past_rates(spec.model, os.environ.get("KVLAB_DATABASE_URL")) or estimate.DEFAULT_RATES
    seconds = estimate.estimate_seconds(spec, rates)
    trials_col, items_col, evals_col, time_col = st.columns(4)
    trials_col.metric("Trials (configs)", len(configs))
    items_col.metric("Items per config", items)
    evals_col.metric("Evaluations", len(configs) * items)
    time_col.metric("Estimated duration", formatting.fmt_duration(seconds))
    st.caption(f"Configs: {', '.join(c.label for c in configs)}. Estimate from {rates.source}.")
    capacity_preview(spec)
    executor = executor_choice()
    download_col, workers_col, launch_col = st.columns([1.2, 1, 1])
    download_col.download_button("Download spec (TOML)", data=dump_spec(spec), file_name=f"{spec.name}.toml",
                                 mime="application/toml", icon=":material/download:", on_click="ignore")
    workers = int(workers_col.number_input(
        "Local workers", min_value=1, max_value=max(1, os.cpu_count() or 1), value=1, step=1,
        help="Workers split the CPU cores, so on a CPU one worker is as fast as several."))
    if launch_col.button("Launch", type="primary", key="launch", disabled=executor.problem is not None,
                         icon=":material/play_arrow:"):
        launch(spec, workers, st.session_state.get("form_warnings", []), executor)
