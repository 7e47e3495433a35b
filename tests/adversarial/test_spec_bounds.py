"""Issue 18, items 9 and 13: a valid-looking spec cannot ask for unbounded work, and no input is
silently ignored.  Every count is bounded where a spec is parsed, by counting (never by building
what is counted), with the limit and the variable that raises it in the message; a spec whose
``[tune]`` table, empty sweep list or over-long context would be ignored or fail later is refused
before anything is stored or any model loads.

The whole-process cases run the real ``kvlab`` command (the harness of ``test_cli_inputs``) with a
``KVLAB_HOME`` where no model is pulled: a refusal that came after the model load would say so.
"""

from __future__ import annotations

import json

import pytest

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.limits import BOUNDS
from kvlab.core.tune_spec import TuneSpec, candidate_grid, grid_points
from kvlab.experiments.submit import store_experiment
from kvlab.spec_files import check_on_this_host, parse_spec_toml
from kvlab.store import Store
from tests.adversarial.test_cli_inputs import Kvlab, write

TASKS = [{"name": "passkey", "context_lengths": [256]}]
NATIVE = '[[tasks]]\nname = "passkey"\ncontext_lengths = [256]\n'
#: 4 formats x (none + 3 methods x 834 ratios): 10,012 configs, the size of the probe's sweep.
BIG_SWEEP = {"quant": ["none", "int8", "int4", "int2"], "evict": ["none", "snapkv", "knorm", "tova"],
             "ratios": [round(0.001 + i * 0.001, 3) for i in range(834)]}


def refused(data: dict, *says: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_spec(data)
    message = str(info.value)
    assert "\n" not in message, message
    for fragment in says:
        assert fragment in message, message
    return message


# -- counts ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("data, says", [
    ({"tasks": [{"name": "passkey", "context_lengths": [256], "num_items": 1_000_000}], "configs": [{}]},
     ("tasks.0.num_items: 1,000,000 items", "at most 10,000", "KVLAB_MAX_ITEMS")),
    ({"tasks": [{"name": "multikey", "context_lengths": [256], "num_items": 10_001}], "configs": [{}]},
     ("tasks.0.num_items: 10,001 items", "KVLAB_MAX_ITEMS")),
    ({"tasks": TASKS, "sweep": BIG_SWEEP},
     ("sweep: the [sweep] grid expands to 10,012 configs", "at most 512 configs", "KVLAB_MAX_CONFIGS")),
    ({"tasks": TASKS, "configs": [{"quant": "int8", "residual_length": i} for i in range(20_000)]},
     ("configs: 20,000 [[configs]] entries", "at most 512 configs", "KVLAB_MAX_CONFIGS")),
    ({"tasks": TASKS, "configs": [{"quant": "int8", "residual_length": i} for i in range(510)],
      "sweep": {"quant": ["int4"], "evict": ["none", "snapkv"], "ratios": [0.1, 0.2, 0.3, 0.4]}},
     ("configs: 516 configs (the baseline, [[configs]] and the [sweep] grid)", "at most 512")),
    ({"tasks": TASKS * 300, "configs": [{}]}, ("tasks: 300 [[tasks]] entries", "at most 256", "KVLAB_MAX_TASKS")),
])
def test_counts_are_bounded(data, says):
    refused(data, *says)


def test_total_item_evaluations_are_bounded():
    data = {"tasks": [{"name": "passkey", "context_lengths": [256, 512, 1024], "num_items": 10_000}],
            "configs": [{}, {"quant": "int8"}, {"quant": "int4"}, {"quant": "int2"}]}
    refused(data, "tasks: 120,000 item evaluations (30,000 items x 4 configs)", "at most 100,000",
            "KVLAB_MAX_ITEM_EVALS")
    parse_spec(data | {"configs": data["configs"][:3]})  # 90,000: within the bound


@pytest.mark.parametrize("variable, value, data", [
    ("KVLAB_MAX_ITEMS", "1000000", {"tasks": [{"name": "passkey", "context_lengths": [256], "num_items": 1_000_000}],
                                    "configs": [{}]}),
    ("KVLAB_MAX_CONFIGS", "20000", {"tasks": TASKS, "sweep": BIG_SWEEP}),
])
def test_the_variable_in_the_message_raises_the_bound(monkeypatch, variable, value, data):
    monkeypatch.setenv("KVLAB_MAX_ITEM_EVALS", "100000000")
    refused(data, variable)
    monkeypatch.setenv(variable, value)
    parse_spec(data)


@pytest.mark.parametrize("value", ["0", "-3", "lots", "1e3", "nan"])
def test_a_bad_bound_variable_is_one_line(monkeypatch, value):
    monkeypatch.setenv("KVLAB_MAX_CONFIGS", value)
    refused({"tasks": TASKS, "configs": [{}]}, "KVLAB_MAX_CONFIGS must be a positive whole number", repr(value))


def test_every_bound_names_its_variable():
    assert {b.variable for b in BOUNDS.values()} == {
        "KVLAB_MAX_CONFIGS", "KVLAB_MAX_TASKS", "KVLAB_MAX_ITEMS", "KVLAB_MAX_ITEM_EVALS", "KVLAB_MAX_TUNE_POINTS"}


# -- the tune space --------------------------------------------------------------------------------

def test_a_tiny_budget_step_is_refused_not_built():
    refused({"tasks": TASKS, "tune": {"evict": ["snapkv"], "budget_step": 1e-9}},
            "tune.budget_step", "greater than or equal to 0.001")


def test_a_huge_tune_space_is_counted_and_refused():
    space = {"quant": ["none", "int8", "int4", "int2"], "evict": ["none", "snapkv", "knorm", "tova"],
             "budget_range": [0.001, 0.999], "budget_step": 0.001, "residual_lengths": list(range(0, 8192, 8))}
    refused({"tasks": TASKS, "tune": space}, "tune: the search space holds", "at most 100,000",
            "KVLAB_MAX_TUNE_POINTS")


@pytest.mark.parametrize("space", [
    {},
    {"quant": ["none"], "evict": ["none", "snapkv"]},
    {"quant": ["int8", "fp8_e4m3"], "evict": ["none"], "group_sizes": [32, 64, 128], "residual_lengths": [0, 64]},
    {"quant": ["none", "int4", "int2"], "evict": ["snapkv", "knorm"], "budget_range": [0.1, 0.9],
     "budget_step": 0.1, "query_aware": True},
    {"quant": ["none", "int8"], "evict": ["none", "snapkv"], "budget_range": [0.5, 0.5]},
])
def test_the_count_is_the_grid_built(space):
    tune = TuneSpec(**space)
    assert grid_points(tune) == len(candidate_grid(tune))


# -- silently ignored input (item 13) --------------------------------------------------------------

@pytest.mark.parametrize("sweep, says", [
    ({"evict": ["snapkv"], "ratios": []}, "sweep.ratios: List should have at least 1 item"),
    ({"quant": [], "evict": ["snapkv"]}, "sweep.quant: List should have at least 1 item"),
    ({"quant": ["int8"], "evict": []}, "sweep.evict: List should have at least 1 item"),
    ({"evict": ["snapkv"], "ratios": [0.5, 0.5]}, "sweep.ratios: lists 0.5 twice"),
    ({"quant": ["int4", "INT4"]}, "sweep.quant: lists int4 twice"),
    ({}, "sweep: the grid holds only the baseline"),
    ({"quant": ["none"], "evict": ["none"], "ratios": [0.25]}, "sweep: the grid holds only the baseline"),
])
def test_a_sweep_that_would_run_only_the_baseline_is_refused(sweep, says):
    refused({"tasks": TASKS, "sweep": sweep}, says)


def test_a_context_longer_than_the_registry_model_takes():
    refused({"tasks": [{"name": "passkey", "context_lengths": [1024, 9000]}], "configs": [{}]},
            "tasks.0.context_lengths: [9000] exceed smollm2-135m's maximum context of 8,192 tokens")
    refused({"model": "gemma3-270m", "tasks": TASKS + [{"name": "perplexity", "context_lengths": [40_000]}],
             "configs": [{}]}, "tasks.1.context_lengths: [40000]", "32,768")
    for length in (8183, 8192):  # the prompt fits, its 10 new tokens do not: refused before anything is stored
        refused({"tasks": [{"name": "passkey", "context_lengths": [length]}], "configs": [{}]},
                f"[{length}] exceed smollm2-135m's maximum context of 8,192 tokens with 10 new tokens")
    refused({"tasks": [{"name": "passkey", "context_lengths": [8100], "max_new_tokens": 100}], "configs": [{}]},
            "with 100 new tokens")
    parse_spec({"tasks": [{"name": "passkey", "context_lengths": [8182]}], "configs": [{}]})  # 8,192 with them


def test_an_endpoint_decides_its_own_context():
    """openai_compat serves a model of its own: the spec's model (its tokenizer) says nothing of the limit."""
    parse_spec({"backend": {"kind": "openai_compat", "base_url": "http://127.0.0.1:1/v1"},
                "tasks": [{"name": "passkey", "context_lengths": [20_000]}], "configs": [{}]})


def test_a_local_model_directory_is_checked_before_it_is_stored(tmp_path, monkeypatch):
    """Validation knows only the registry (a stored spec parses alike on every host); the submit
    path reads a local directory's config.json and refuses before storing."""
    model = tmp_path / "tiny-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 512}}))
    spec = parse_spec({"model": str(model), "tasks": [{"name": "passkey", "context_lengths": [256, 1024]}],
                       "configs": [{}]})
    with pytest.raises(ConfigError, match=r"tasks.0.context_lengths: \[1024\] exceed .*maximum context of 512"):
        check_on_this_host(spec)
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        with pytest.raises(ConfigError):
            store_experiment(store, spec)
        assert store.list_experiments() == []


def test_jsonl_records_count_towards_the_bound_before_storing(tmp_path, monkeypatch):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"context": f"c{i}", "question": "q?", "answer": "a"}) + "\n"
                            for i in range(60)))
    monkeypatch.setenv("KVLAB_MAX_ITEM_EVALS", "100")
    spec = parse_spec({"tasks": [{"name": "jsonl", "path": str(rows)}], "configs": [{}, {"quant": "int8"}]})
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        with pytest.raises(ConfigError, match=r"tasks: 120 item evaluations \(60 items x 2 configs\); at most 100"):
            store_experiment(store, spec)
        assert store.list_experiments() == []
        monkeypatch.setenv("KVLAB_MAX_ITEM_EVALS", "120")
        assert store_experiment(store, spec, ()) > 0
        assert len(store.list_experiments()) == 1


def test_toml_numbers_are_bounded_too():
    """``num_items = 1e6`` is a TOML float: bounded the same."""
    with pytest.raises(ConfigError, match=r"p.toml: tasks.0.num_items: 1,000,000 items"):
        parse_spec_toml(NATIVE + "num_items = 1e6\n[[configs]]\n", "p.toml")


# -- the whole process: exit 2, one line, nothing stored, no model loaded -----------------------------

@pytest.fixture
def kvlab(tmp_path) -> Kvlab:
    return Kvlab(tmp_path)


def nothing_stored(kvlab: Kvlab) -> bool:
    if not kvlab.db.exists():
        return True
    with Store(f"sqlite:///{kvlab.db}") as store:
        return store.list_experiments() == []


TUNE_TABLE = '[tune]\nquant = ["int8", "int4"]\nmax_trials = 4\n'


@pytest.mark.parametrize("name, text, options, says", [
    ("items.toml", NATIVE + "num_items = 1e6\n[[configs]]\n", (),
     ("items.toml: tasks.0.num_items: 1,000,000 items", "KVLAB_MAX_ITEMS")),
    ("sweep.toml", NATIVE + '[sweep]\nquant = ["none", "int8", "int4", "int2"]\n'
     'evict = ["none", "snapkv", "knorm", "tova"]\nratios = [' + ", ".join(map(str, BIG_SWEEP["ratios"])) + "]\n",
     ("--background",), ("sweep.toml: sweep: the [sweep] grid expands to 10,012 configs", "KVLAB_MAX_CONFIGS")),
    ("step.toml", NATIVE + '[tune]\nevict = ["snapkv"]\nbudget_step = 1e-9\n', (),
     ("step.toml: tune.budget_step",)),
    ("tune.toml", NATIVE + TUNE_TABLE, (), ("tune.toml: has a [tune] table", "kvlab tune tune.toml")),
    ("tune.toml", NATIVE + TUNE_TABLE, ("--background",), ("kvlab tune tune.toml",)),
    ("empty.toml", NATIVE + '[sweep]\nevict = ["snapkv"]\nratios = []\n', (), ("empty.toml: sweep.ratios",)),
    ("long.toml", '[[tasks]]\nname = "passkey"\ncontext_lengths = [16384]\n[[configs]]\n', (),
     ("long.toml: tasks.0.context_lengths: [16384] exceed smollm2-135m's maximum context of 8,192 tokens",)),
])
def test_refused_before_anything_is_stored(kvlab, name, text, options, says):
    write(kvlab.home / name, text)
    kvlab.user_error("run", name, *options, says=says)
    assert nothing_stored(kvlab)


def test_a_local_model_too_short_is_refused_before_it_loads(kvlab):
    """The directory has only a config.json: loading it would fail differently."""
    model = kvlab.home / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 512}))
    write(kvlab.home / "local.toml", f'model = "{model}"\n' + NATIVE.replace("[256]", "[1024]") + "[[configs]]\n")
    for options in ((), ("--background", "--workers", "0")):
        kvlab.user_error("run", "local.toml", *options,
                         says=("tasks.0.context_lengths: [1024] exceed", "maximum context of 512 tokens"))
        assert nothing_stored(kvlab)


def test_tune_refuses_the_same_counts(kvlab):
    write(kvlab.home / "step.toml", NATIVE + '[tune]\nevict = ["snapkv"]\nbudget_step = 1e-9\n')
    kvlab.user_error("tune", "step.toml", says=("step.toml: tune.budget_step",))
    assert nothing_stored(kvlab)



# -- settings the registry model or the method cannot take (this round's probes) -------------------

@pytest.mark.parametrize("config, says", [
    ({"evict": "streaming_llm", "decode": {"interval": 1, "target_tokens": 1}},
     ("decode.target_tokens = 1 keeps no more than the n_sink = 4", "give target_tokens above n_sink")),
    ({"evict": "streaming_llm", "n_sink": 8, "decode": {"interval": 1, "target_tokens": 8}},
     ("decode.target_tokens = 8", "n_sink = 8")),
    ({"quant": "int4", "skip_layers": {"first": 1000}}, ("configs.0.skip_layers", "smollm2-135m")),
    ({"quant": "int4", "skip_layers": {"layers": [31]}}, ("configs.0.skip_layers", "31", "smollm2-135m")),
    ({"quant": "int4", "skip_layers": {"first": 30}},
     ("configs.0.skip_layers", "keeps every one of the model's 30 layers")),
])
def test_a_setting_the_method_or_the_model_cannot_take_is_refused_at_parse(config, says):
    """Each passed validation and failed on a worker after the model loaded (the decode target as
    kvpress's assertion, which the worker took for a host problem and requeued; ``first = 1000``
    silently kept all 30 layers 16-bit)."""
    refused({"tasks": TASKS, "configs": [config]}, *says)


def test_a_valid_decode_target_and_layer_pattern_still_parse():
    parse_spec({"tasks": TASKS, "configs": [{"evict": "streaming_llm", "decode": {"interval": 1, "target_tokens": 5}},
                                            {"quant": "int4", "skip_layers": {"first": 2, "last": 2}},
                                            {"quant": "int2", "skip_layers": {"layers": [0, 29]}}]})
