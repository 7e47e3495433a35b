"""A spec's ``[load]`` table: where it may run and how its budget reaches each engine's flag, and the whole path --
``kvlab run`` through a worker into the store, ``kvlab show`` and the JSON -- against a stand-in scheduler."""

from __future__ import annotations

import json

import pytest

from kvlab.cli.main import main
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ServerOptions, parse_spec
from kvlab.core.kv_config import BASELINE, KVCacheConfig
from kvlab.engines.server_flags import server_command
from kvlab.engines.servers.installs import Installed
from kvlab.store import Store
from tests.load.fake_scheduler import Scheduler, scheduler_server

TASKS = [{"name": "passkey", "context_lengths": [256], "num_items": 2, "max_new_tokens": 4}]
LOAD = {"kv_budget_mib": 32, "concurrency": [1, 2], "requests": 4, "output_tokens": 5}


def spec(kind: str, load: dict | None = None, **backend) -> dict:
    return {"name": "l", "model": "smollm2-135m", "backend": {"kind": kind, **backend}, "tasks": TASKS,
            "configs": [{"name": "baseline"}], "load": LOAD if load is None else load}


@pytest.mark.parametrize(("data", "words"), [
    (spec("embedded"), "Capacity section"),
    (spec("llamacpp", server={"max_model_len": 512}), "remove server.max_model_len"),
    (spec("vllm", LOAD | {"kv_budget_mib": None}), "give the KV memory"),
    (spec("vllm", server={"kv_cache_gib": 1.0}), "remove server.kv_cache_gib"),
    (spec("vllm", server={"memory_fraction": 0.5}), "remove server.memory_fraction"),
    (spec("openai_compat", base_url="http://127.0.0.1:1/v1"), "remove load.kv_budget_mib"),
    (spec("vllm", LOAD | {"concurrency": [], "request_rates": []}), "at least one load level"),
])
def test_a_load_table_where_it_cannot_run_is_refused_with_the_reason(data, words):
    with pytest.raises(ConfigError, match="load") as refused:
        parse_spec(data)
    assert words in str(refused.value)


def test_the_budget_is_each_engines_own_flag_the_same_bytes_for_every_config():
    installed = Installed("python", cpu_build=True)
    budget = 32 << 20
    for config in (BASELINE, KVCacheConfig(quant="fp8_e4m3")):
        argv = server_command("vllm", "m", config, ServerOptions(), 8000, "m", installed=installed,
                              kv_budget=(budget, 11_520.0))
        assert argv.count("--kv-cache-memory-bytes") == 1 and argv[argv.index("--kv-cache-memory-bytes") + 1] == \
            str(budget)  # not the CPU build's default 1 GiB
    # SGLang sizes its pool in tokens: the budget over each config's bytes per token
    baseline = server_command("sglang", "m", BASELINE, ServerOptions(), 8000, "m", kv_budget=(budget, 23_040.0))
    fp8 = server_command("sglang", "m", KVCacheConfig(quant="fp8_e4m3"), ServerOptions(), 8000, "m",
                         kv_budget=(budget, 11_520.0))
    tokens = [int(argv[argv.index("--max-total-tokens") + 1]) for argv in (baseline, fp8)]
    assert tokens == [budget // 23_040, budget // 11_520]
    with pytest.raises(ConfigError, match="max-total-tokens"):
        server_command("sglang", "m", BASELINE, ServerOptions(extra_args=["--max-total-tokens", "9"]), 8000, "m")
    # llama.cpp sizes its pool in cells (n_ctx): the budget over each config's bytes per token, keys and values in
    # their own types, in whole multiples of 256 (llama.cpp rounds n_ctx up to one, past the budget)
    cells = [int(argv[argv.index("--n_ctx") + 1]) for argv in (
        server_command("llamacpp", "m.gguf", config, ServerOptions(), 8000, "m", kv_budget=(budget, per_token))
        for config, per_token in ((BASELINE, 23_040.0), (KVCacheConfig(quant="q8_0", value_quant="q4_0"), 9_360.0)))]
    assert cells == [budget // 23_040 // 256 * 256, budget // 9_360 // 256 * 256] == [1_280, 3_584]


def test_a_load_table_moved_to_a_backend_without_one_is_refused_not_dropped(tmp_path, capsys):
    path = tmp_path / "vllm.toml"
    path.write_text('name = "l"\n[backend]\nkind = "vllm"\n[[tasks]]\nname = "passkey"\ncontext_lengths = [256]\n'
                    'num_items = 1\n[[configs]]\nname = "baseline"\n[load]\nkv_budget_mib = 32\n')
    assert main(["run", str(path), "--backend", "embedded"]) == 2
    err = capsys.readouterr().err
    assert "--backend embedded: load:" in err and "Capacity section" in err and "Traceback" not in err


@pytest.mark.model  # the task's tokenizer (the default model's)
def test_kvlab_run_stores_each_level_and_prints_both_halves(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{tmp_path / 'kvlab.sqlite'}")
    scheduler = Scheduler(slots=4, clients=2, gate="seen")
    with scheduler_server(scheduler) as root:
        path = tmp_path / "load.toml"
        path.write_text(
            f'name = "under-load"\nmodel = "smollm2-135m"\n[backend]\nkind = "openai_compat"\nbase_url = "{root}/v1"\n'
            'model_id = "m"\n[[tasks]]\nname = "passkey"\ncontext_lengths = [256]\nnum_items = 2\nmax_new_tokens = 4\n'
            '[[configs]]\nname = "baseline"\n[load]\nconcurrency = [1, 2]\nrequests = 4\noutput_tokens = 5\n')
        assert main(["run", str(path), "--quiet", "--json", str(tmp_path / "out.json")]) == 0
        printed = capsys.readouterr().out
        assert main(["run", str(path), "--no-store"]) == 2
        assert "drop --no-store" in capsys.readouterr().err
    assert "what each config buys under load" in printed and "2 clients" in printed
    with Store() as store:
        (experiment,) = store.list_experiments()
        levels = store.load_levels(experiment.id)
    assert [(level.config_name, level.mode, level.level) for level in levels] == [
        ("baseline", "closed", 1.0), ("baseline", "closed", 2.0)]
    for level in levels:
        assert (level.result["requests"], level.result["completed"], level.result["errors"]) == (4, 4, 0)
        assert level.result["output_tokens"] == 4 * 5
        # its models are owned_by vllm: its /metrics were read by vLLM's names while the level ran
        assert 1 <= level.result["server"]["max_running"] <= level.level and level.result["server"]["samples"] >= 2
    assert [level["level"] for level in json.loads((tmp_path / "out.json").read_text())["load"]] == [1.0, 2.0]
    assert main(["show", str(experiment.id)]) == 0
    assert "what each config buys under load" in capsys.readouterr().out


def test_a_load_target_picks_the_most_compressed_acceptable_config_that_holds_it(tmp_path):
    """Synthetic servers (tests/dashboard_data.py): at 4 clients the baseline's pool runs 2 requests (20 tokens/s),
    the compressed ones 4 (40); int4 is the acceptable one (its fidelity certified), so it is the sweet spot that
    holds 35 tokens/s, and none holds 100."""
    from kvlab.analysis.summary import summarize
    from kvlab.core.load_spec import LoadTarget
    from kvlab.core.margins import Margins
    from kvlab.experiments.load_report import sweet_spot_under_target, target_lines
    from tests.dashboard_data import populate

    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        experiment_id = populate(store, fidelity=True, load=True)
        results, records = store.item_results(experiment_id), store.load_levels(experiment_id)
    summaries = summarize(results, "baseline", Margins(max_drop=0.5))
    chosen, missed = sweet_spot_under_target(summaries, "baseline", records,
                                             LoadTarget(clients=4, min_output_tokens_per_s=35, max_p99_ttft_ms=250))
    assert chosen == "int4" and missed == ["baseline missed it (20.0 output tokens/s, p99 TTFT 400 ms)"]
    lines = target_lines(summaries, "baseline", records, LoadTarget(clients=4, min_output_tokens_per_s=100))
    assert "no acceptable config does" in lines[0] and len(lines) == 1 + 4
    with pytest.raises(ConfigError, match="target.clients 8 is no closed-loop level"):
        parse_spec(spec("vllm", LOAD | {"target": {"clients": 8, "max_p99_ttft_ms": 100}}))
    with pytest.raises(ConfigError, match="min_output_tokens_per_s, max_p99_ttft_ms or both"):
        parse_spec(spec("vllm", LOAD | {"target": {"clients": 2}}))
