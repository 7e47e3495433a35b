"""kvlab's llama.cpp backend against a real llama.cpp: the build ``scripts/install_llamacpp.sh`` makes for this host
(llama-cpp-python's server on the vendored llama.cpp, in its own venv under ``$KVLAB_HOME/engines/llamacpp``).

The README's test command builds it once (then it is cached), so under that command a missing build fails these
tests instead of skipping them.  llama.cpp runs on every x86 CPU this project has (AVX-512 or not): nothing here
depends on the host's instruction set.  One sweep of four K/V pairs runs through ``kvlab run`` (one server per pair,
each started once, in seconds) on the default model's own GGUF file; the same items run on the embedded engine with
its closest formats under the same config names, for the cross-engine table.
"""

from __future__ import annotations

import json
import math
import socket

import pytest
import tomli_w

from kvlab.analysis.agreement import engine_agreement
from kvlab.analysis.noise_floor import noise_floor
from kvlab.capacity.architectures import architecture
from kvlab.capacity.projection import Pool, project_config
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ServerOptions, parse_spec
from kvlab.core.formats import FORMATS
from kvlab.core.geometry import CacheGeometry
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.results import NOISE_FLOOR_KEY, TEACHER_BASELINE_OUTPUT, TEACHER_BASELINE_SAMPLE, Fidelity
from kvlab.engines.launched import LaunchedServerEngine
from kvlab.engines.managed_server import ManagedServer, ServerStartError, free_port
from kvlab.engines.server_flags import server_command, server_env
from kvlab.engines.server_logs import startup_failure
from kvlab.engines.servers import serving_engine
from kvlab.engines.servers.installs import Installed
from kvlab.store import Store
from tests.serving import installed_engine_python, kvlab_cli
from tests.waiting import SAFETY_S

pytestmark = pytest.mark.model

SMOLLM2 = CacheGeometry(num_layers=30, num_kv_heads=3, head_dim=64)
LLAMACPP = serving_engine("llamacpp")
ITEMS = 8
# llama.cpp's K/V pairs, named so that the embedded engine's closest formats pair with them in the cross-engine
# table: q8_0 (32 values per float16 scale) with kvlab's int8 in groups of 32 channels per token, no 16-bit window.
LLAMACPP_CONFIGS = [
    {"name": "baseline"},
    {"name": "8-bit", "quant": "q8_0"},
    {"name": "4-bit", "quant": "q4_0"},
    {"name": "k8v4", "quant": "q8_0", "value_quant": "q4_0"},
    {"name": "4-bit-norot", "quant": "q4_0", "rotation": False},  # llama.cpp's rotation off (LLAMA_ATTN_ROT_DISABLE)
]
EMBEDDED_CONFIGS = [
    {"name": "baseline"},
    {"name": "8-bit", "quant": "int8", "group_size": 32, "key_axis": "token", "residual_length": 0},
]


#: One KV budget for every K/V pair: 1,280 f16 cells (28.125 MiB at 23,040 B/token), two of the items' sequences
#: (about 540 prompt and 16 new tokens); at their own bytes per token q8_0 gets 2,304 cells (four), q4_0 4,352
#: (seven), k8v4 3,072 (five): whole multiples of 256, as llama.cpp rounds its pool.  On llama-server with 4 clients.
LOAD = {"kv_budget_mib": 28.125, "concurrency": [4], "requests": 8, "output_tokens": 16}
LOAD_CELLS = {"baseline": 1_280, "8-bit": 2_304, "4-bit": 4_352, "k8v4": 3_072, "4-bit-norot": 4_352}


def spec_toml(name: str, kind: str, configs: list[dict] | None, num_items: int = ITEMS, **rest: object) -> str:
    """Passkey items at 512 tokens (and a server that may take as long as the host needs to start); ``configs``
    None: a tune's spec.  With a ``load`` table the budget sizes each llama.cpp pool, else 2,048 cells do."""
    backend: dict = {"kind": kind}
    if kind == "llamacpp":
        backend["server"] = {"startup_timeout_s": SAFETY_S} | ({} if "load" in rest else {"max_model_len": 2048})
    return tomli_w.dumps({
        "name": name, "model": "smollm2-135m", "seed": 0, **rest, "backend": backend,
        "tasks": [{"name": "passkey", "context_lengths": [512], "depths": [0.25, 0.75], "num_items": num_items,
                   "max_new_tokens": 8}],
    } | ({"configs": configs} if configs is not None else {}))


@pytest.fixture(scope="module")
def llamacpp_python() -> str:
    return installed_engine_python("llamacpp")


@pytest.fixture(scope="module")
def runs(llamacpp_python, tmp_path_factory) -> dict:
    """The sweep on llama.cpp (experiment 1), the same items on the embedded engine (experiment 2), one store."""
    folder = tmp_path_factory.mktemp("llamacpp-real")
    db = folder / "kvlab.sqlite"
    (folder / "llamacpp.toml").write_text(spec_toml("llamacpp-real", "llamacpp", LLAMACPP_CONFIGS, load=LOAD))
    (folder / "embedded.toml").write_text(spec_toml("embedded-real", "embedded", EMBEDDED_CONFIGS))
    on_llamacpp = kvlab_cli("run", "llamacpp.toml", "--json", "out.json", db=db, cwd=folder)
    assert on_llamacpp.returncode == 0, on_llamacpp.stderr[-3000:]
    embedded = kvlab_cli("run", "embedded.toml", db=db, cwd=folder)
    assert embedded.returncode == 0, embedded.stderr[-3000:]
    compared = kvlab_cli("compare", "2", "1", db=db, cwd=folder)
    with Store(f"sqlite:///{db}") as store:
        yield {"llamacpp": store.item_results(1), "embedded": store.item_results(2), "stdout": on_llamacpp.stdout,
               "load": store.load_levels(1),
               "json": json.loads((folder / "out.json").read_text()), "compare": compared}


def _bits(config: dict) -> float:
    key = config.get("quant", "none")
    return (FORMATS[key].bits_per_value + FORMATS[config.get("value_quant", key)].bits_per_value) / 2


def test_every_pair_shows_the_pool_bytes_of_its_own_server_against_the_hand_formula(runs):
    """llama.cpp's log states each pool (cells, K and V MiB); per token it is the geometry with ggml's blocks:
    f16 23,040 B, q8_0 12,240 B (34 B per 32 values), q4_0 6,480 B (18 B per 32), q8_0 keys with q4_0 values 9,360."""
    results = runs["llamacpp"]
    assert {r.config_name for r in results} == {c["name"] for c in LLAMACPP_CONFIGS}
    assert all(r.error is None and r.physical_kv_bytes and r.kv_bytes_estimated for r in results)
    for config in LLAMACPP_CONFIGS:
        result = next(r for r in results if r.config_name == config["name"])
        per_token = result.physical_kv_bytes / result.prompt_tokens
        assert per_token == pytest.approx(SMOLLM2.bytes_per_token(_bits(config)), rel=0.01), config
        source = result.extra["kv_bytes_source"]
        assert "llama_kv_cache: size =" in source and ", agree" in source, source
        # llama.cpp's own choice, recorded: it rotates quantized keys and values (src/llama-kv-cache.cpp attn_rot_k/v)
        rotated = config.get("quant", "none") != "none" and config.get("rotation", True)
        assert f"the engine chose attn_rot_k={int(rotated)}, attn_rot_v={int(rotated)}" in source, source
    assert all(r.score == 1.0 for r in results if r.config_name == "baseline")  # the model does the task here


def test_value_quantization_runs_with_flash_attention_and_the_launch_says_so(runs):
    launches = {launch["config"]: launch["command"] for launch in runs["json"]["engine"]["launches"]
                if not launch.get("load")}
    assert set(launches) == {c["name"] for c in LLAMACPP_CONFIGS}
    for command in launches.values():
        assert command[command.index("--flash_attn") + 1] == "true"
    k8v4 = launches["k8v4"]
    assert (k8v4[k8v4.index("--type_k") + 1], k8v4[k8v4.index("--type_v") + 1]) == ("8", "2")
    assert k8v4[k8v4.index("--model") + 1].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")  # the model's own file


def test_under_load_llama_server_runs_as_many_slots_as_the_budget_holds(runs):
    """The load phase on llama.cpp's own llama-server, every K/V pair in the same 28.1 MiB budget: 4 clients, 8
    requests of the items' prompts.  The f16 pool holds two sequences and defers the rest; q8_0's, q4_0's and
    k8v4's hold the four at once.  The cells are what llama.cpp logs, the slots what its /metrics counts.  Counts
    only: the throughput ratios are benchmarks/load_bench.py's."""
    levels = {level.config_name: level.result for level in runs["load"]}
    assert set(levels) == set(LOAD_CELLS)
    loads = {launch["config"]: launch for launch in runs["json"]["engine"]["launches"] if launch.get("load")}
    for name, level in levels.items():
        assert (level["mode"], level["level"], level["completed"], level["errors"]) == ("closed", 4.0, 8, 0), name
        assert level["pool_tokens"] == LOAD_CELLS[name] and level["output_tokens"] == 8 * 16, name
        launch = loads[name]
        assert launch["command"][0].endswith("llama-server") and "-kvu" in launch["command"], launch
        assert launch["slots"] == LOAD_CELLS[name] // launch["longest_request_tokens"], launch
        assert level["server"]["max_running"] == min(4, launch["slots"]), (name, level["server"], launch)
        # kvlab capacity's arithmetic gives the same pool and slots: the budget, llama.cpp's 256-cell granule
        config = KVCacheConfig(**{k: v for k, v in next(c for c in LLAMACPP_CONFIGS if c["name"] == name).items()
                                  if k != "name"})
        projected = project_config(config, architecture("smollm2-135m"), launch["longest_request_tokens"],
                                   Pool(round(LOAD["kv_budget_mib"] * (1 << 20)), "the load's budget"),
                                   server_block=LLAMACPP.pool_block_tokens, pool_granule=LLAMACPP.pool_granule_tokens)
        assert (projected.pool_tokens, projected.sequences) == (LOAD_CELLS[name], launch["slots"]), (name, projected)
    base = levels["baseline"]["server"]
    assert base["max_running"] == 2 and base["max_waiting"] >= 1, base
    for name in ("8-bit", "4-bit", "k8v4", "4-bit-norot"):
        assert levels[name]["server"]["max_waiting"] < base["max_waiting"], (name, levels[name]["server"], base)
    assert "what each config buys under load" in runs["stdout"]


def test_the_sweep_is_decided_by_fidelity_measured_through_llamacpp(runs):
    """Each pair's items carry the sampled estimate against the f16 server's sampled continuation, and the verdict
    per task is fidelity's."""
    for result in runs["llamacpp"]:
        if result.config_name == "baseline":
            assert result.fidelity is None and result.extra.get("fidelity_reference")
            continue
        fidelity = result.fidelity
        assert fidelity is not None and fidelity.teacher == TEACHER_BASELINE_SAMPLE, result.extra
        assert fidelity.tokens >= 1 and all(math.isfinite(kl) for kl in fidelity.kl)
    verdicts = runs["stdout"].split("verdict per task", 1)[1].split("\n\n", 1)[0].splitlines()
    for name in ("8-bit", "4-bit", "k8v4"):
        row = next(line for line in verdicts if line.startswith(name))
        assert " fidelity " in row and "mean KL" in row, row


def test_every_report_shows_the_engines_noise_floor_measured_on_the_baselines_items(runs):
    """The f16 server against itself: each item's sample scored with its prompt cached and afresh (cache_salt).
    llama.cpp's logits change with the batch shape, so the two differ on some token; the floor is reported beside
    the configs' fidelity."""
    baseline = [r for r in runs["llamacpp"] if r.config_name == "baseline"]
    floors = [Fidelity.from_dict(r.extra[NOISE_FLOOR_KEY]) for r in baseline]
    assert len(floors) == ITEMS and all(f.teacher == TEACHER_BASELINE_SAMPLE for f in floors)
    assert any(kl != 0.0 for f in floors for kl in f.kl), "the salted scoring reused the cached prefix"
    floor = noise_floor(runs["llamacpp"], "baseline")
    assert floor is not None and floor.summary.items == ITEMS
    (line,) = [line for line in runs["stdout"].splitlines() if line.startswith("engine noise floor: mean KL")]
    assert f"over {ITEMS} items" in line, line
    # under load the server is llama.cpp's own llama-server, which scores no prompt: said in one line, not dropped
    assert ("noise floor under load not measured: the load's server answers no scoring request (it returns no "
            "token ids (return_token_ids))") in runs["stdout"].splitlines()


def test_the_same_items_on_two_engines_in_one_table(runs):
    rows = {row.config_name: row for row in engine_agreement(runs["embedded"], runs["llamacpp"])}
    assert set(rows) == {"baseline", "8-bit"}
    for row in rows.values():
        assert row.items == ITEMS and row.estimated_b and not row.estimated_a
        # two engines (float32 PyTorch, llama.cpp on Q4_1 weights) and two 8-bit formats, the same answers to most
        # passkey items at 512 tokens
        assert row.same_outcome >= 0.75, row
    # 16-bit caches of the same tokens: the same bytes per token, measured here and stated by llama.cpp
    assert rows["baseline"].kv_bytes_b == pytest.approx(rows["baseline"].kv_bytes_a, rel=0.01)
    assert rows["8-bit"].fidelity_a.teacher == TEACHER_BASELINE_OUTPUT
    assert rows["8-bit"].fidelity_b.teacher == TEACHER_BASELINE_SAMPLE and rows["8-bit"].fidelity_b.items == ITEMS
    table = runs["compare"]
    assert table.returncode == 0, table.stderr
    assert "same outcome" in table.stdout and "mean KL A [95% CI]" in table.stdout
    # every engine's configs, paired by name or not (llama.cpp's k8v4 has no embedded counterpart)
    engines = table.stdout.split("each against its own baseline:", 1)[1]
    assert all(f" {name} " in engines for name in ("8-bit", "4-bit", "k8v4")), engines
    # llama.cpp's baseline kept its sampled continuations; the embedded float32 model scores them: the floor
    (floor,) = [line for line in table.stdout.splitlines() if line.startswith("baselines: KL(llamacpp #1's baseline")]
    assert f"over {ITEMS} items" in floor, floor


def test_a_tune_on_llamacpp_searches_its_kv_types_and_ends_in_llama_servers_flags(llamacpp_python, tmp_path):
    """At loose margins (4 items cannot certify a tight one): the search, its notes and the flags it ends in; with a
    small load and a target every server holds (the test asserts counts, not speed), each candidate's server that
    ran every item and the baseline's were measured under it, and the answer says what the sweet spot buys."""
    spec = tmp_path / "tune.toml"
    load = {"kv_budget_mib": LOAD["kv_budget_mib"], "concurrency": [2], "requests": 2, "output_tokens": 4,
            "target": {"clients": 2, "min_output_tokens_per_s": 0.001}}
    spec.write_text(spec_toml("llamacpp-tune", "llamacpp", None, num_items=4, max_drop=0.5, max_kl=0.5, load=load,
                              tune={"quant": ["q8_0", "int8"], "value_quant": ["q4_0"], "min_items": 4,
                                    "candidates_per_round": 2, "max_trials": 2}))
    tuned = kvlab_cli("tune", str(spec), "--json", str(tmp_path / "tune.json"), db=tmp_path / "kvlab.sqlite",
                      cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    assert "llamacpp has no KV cache like int8: left out of the search" in tuned.stdout + tuned.stderr
    answer = json.loads((tmp_path / "tune.json").read_text())
    config = answer["config"]
    assert config["quant"] == "q8_0", answer
    value = config.get("value_quant") or "q8_0"
    flag = f"--cache-type-k q8_0 --cache-type-v {value} -fa on"
    assert answer["engines"]["llamacpp"]["flag"] == flag and flag in tuned.stdout
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        (experiment,) = store.list_experiments()
        complete = {c.trial_id for c in store.candidates(experiment.id) if c.state == "complete"}
        names = {t.id: t.config_name for t in store.trials(experiment.id) if t.id in complete}
        levels = {level.config_name: level.result for level in store.load_levels(experiment.id)}
    assert set(names.values()) <= set(levels) and answer["label"] in levels
    assert all((result["completed"], result["errors"]) == (2, 0) for result in levels.values()), levels
    assert answer["load"]["target_lines"][0] == (
        f"holding the load target (at least 0.001 output tokens/s at 2 clients): the sweet spot is {answer['label']}")
    assert f"under load: {answer['label']}: " in tuned.stdout


def test_a_taken_port_fails_the_run_in_one_line_with_its_root_cause(llamacpp_python, tmp_path):
    spec = tmp_path / "taken.toml"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        spec.write_text(spec_toml("llamacpp-taken", "llamacpp", [{"name": "baseline"}], num_items=1).replace(
            "[backend.server]\n", f"[backend.server]\nport = {port}\n"))
        ran = kvlab_cli("run", str(spec), "--no-store", db=tmp_path / "kvlab.sqlite", cwd=tmp_path)
    assert ran.returncode != 0 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    (error,) = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert "its port is taken by another process" in error and "address already in use" in error.lower(), error


@pytest.mark.parametrize(("model", "cause"), [
    ("absent.gguf", "its GGUF file is not there"),
    ("garbage.gguf", "llama.cpp cannot load the model file"),
])
def test_a_server_that_cannot_load_its_model_says_why_in_one_line(llamacpp_python, tmp_path, model, cause):
    """The launch kvlab makes, on a model file that is missing or not GGUF: the failure is the line naming it."""
    (tmp_path / "garbage.gguf").write_bytes(b"not a gguf file" * 64)
    installed = Installed(llamacpp_python, threads=1)
    port = free_port()
    command = server_command("llamacpp", str(tmp_path / model), KVCacheConfig(), ServerOptions(), port, "m",
                             installed=installed)
    server = ManagedServer(command, f"http://127.0.0.1:{port}/v1/models", tmp_path / "server.log",
                           env=server_env("llamacpp", installed, local_model=True), startup_timeout_s=SAFETY_S)
    with pytest.raises(ServerStartError) as failed:
        server.start()
        server.wait_healthy()
    server.stop()
    said = startup_failure(server.log_text(), str(failed.value).splitlines()[0], LLAMACPP.startup_faults)
    assert said.startswith(cause) and "\n" not in said, said


def test_a_run_killed_with_sigkill_leaves_no_llamacpp_server_behind(llamacpp_python, tmp_path):
    """Issue 47 row 9: "SIGKILL of the run leaves its llama.cpp servers running as orphans".  ``kvlab run`` is killed
    once its server is up (no ``finally`` of it runs); the server must end with it."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    from tests.waiting import wait_until

    (tmp_path / "killed.toml").write_text(spec_toml("llamacpp-killed", "llamacpp", [{"name": "baseline"}]))
    run = subprocess.Popen([sys.executable, "-m", "kvlab.cli", "run", "killed.toml", "--no-store"], cwd=tmp_path,
                           env=os.environ | {"KVLAB_DATABASE_URL": f"sqlite:///{tmp_path / 'kvlab.sqlite'}"},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def servers() -> list[psutil.Process]:
        try:
            children = psutil.Process(run.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return [child for child in children if "llamacpp_server.py" in " ".join(_cmdline(child))]

    try:
        launched = wait_until(servers, "the run's llama.cpp server", process=run)
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=SAFETY_S)
        wait_until(lambda: all(_gone(server) for server in launched), "the server to end with its run")
    finally:
        run.kill()
        run.wait(timeout=SAFETY_S)


def _cmdline(process) -> list[str]:
    import psutil

    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


def _gone(process) -> bool:
    import psutil

    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_load_phase_without_llama_server_is_refused_before_anything_starts(llamacpp_python, tmp_path):
    """An install whose venv has llama-cpp-python but no llama-server (built before kvlab built it) is refused at the
    configs' check, in one line that says how to build it: nothing is launched."""

    python = tmp_path / "bin" / "python"  # the same interpreter, in a folder without llama-server beside it
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nexec "{llamacpp_python}" "$@"\n')
    python.chmod(0o755)
    spec = parse_spec({"name": "no-llama-server", "model": "smollm2-135m", "load": LOAD,
                       "backend": {"kind": "llamacpp", "server": {"python": str(python)}},
                       "tasks": [{"name": "passkey", "context_lengths": [512], "num_items": 1}],
                       "configs": [{"name": "baseline"}]})
    engine = LaunchedServerEngine(spec, tokenizer=None, tokenizer_note="")
    with pytest.raises(ConfigError, match="load phase runs on llama-server, which is not in .*install_llamacpp.sh"):
        engine.check_configs(spec.all_configs())
    assert engine.launches == []


def test_a_budget_that_holds_no_request_of_the_load_is_refused_before_any_server_starts(llamacpp_python, tmp_path):
    """1 MiB holds no 528-token request at any K/V pair: `kvlab run` exits 2 with one line naming the budget, the config
    and the request's length, at the items' check (as every item refusal), before any server is launched."""
    (tmp_path / "tiny.toml").write_text(spec_toml("tiny-budget", "llamacpp", LLAMACPP_CONFIGS[:2], num_items=1,
                                                  load=LOAD | {"kv_budget_mib": 1.0}))
    ran = kvlab_cli("run", "tiny.toml", db=tmp_path / "kvlab.sqlite", cwd=tmp_path)
    assert ran.returncode == 2, ran.stderr[-2000:]
    assert "load.kv_budget_mib holds 0 tokens of llama.cpp's pool for config 'baseline'" in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr and "did not start" not in ran.stderr, ran.stderr
    assert ran.stderr.strip().splitlines()[-1].endswith("give a larger budget"), ran.stderr
