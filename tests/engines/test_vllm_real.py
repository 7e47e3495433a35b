"""kvlab's vLLM backend against a real vLLM: the CPU build that ``scripts/install_vllm.sh`` installs.

The README's test command installs it (its own venv under ``$KVLAB_HOME/engines/vllm``) as it installs
PostgreSQL and chromium; under that command a missing install fails these tests instead of skipping
them.  One sweep of the three KV dtypes runs through ``kvlab run`` (one server per dtype, each started
once), and most checks read its store: the pool bytes per token against the model's geometry, the
``/metrics`` telemetry, and the same spec on the embedded engine beside it.  A second server, with an
API key, is the live endpoint for ``kvlab doctor``.  Each server takes about a minute to start on 2 cores.

The checks follow the host (:mod:`kvlab.engines.host`): vLLM's CPU build stores fp8 only on a CPU with AVX-512
or AMX.  Where it cannot, the sweep is the baseline, a second vLLM serves the same spec with float16 weights (a
second real setting, so that pool bytes, telemetry and the cross-engine table still compare two servers), and
the fp8 checks become checks of kvlab's refusal; the run's summary names what this host could not run and why.
"""

from __future__ import annotations

import json
import math

import pytest
import tomli_w

from kvlab.analysis.agreement import engine_agreement
from kvlab.analysis.noise_floor import floor_under_load, noise_floor
from kvlab.core.experiment_spec import ServerOptions
from kvlab.core.geometry import CacheGeometry
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.results import NOISE_FLOOR_KEY, TEACHER_BASELINE_OUTPUT, TEACHER_BASELINE_SAMPLE
from kvlab.doctor import diagnose
from kvlab.engines.host import offer
from kvlab.engines.managed_server import ManagedServer, free_port
from kvlab.engines.server_flags import server_command, server_env
from kvlab.engines.servers.installs import Installed
from kvlab.load.metrics import LevelResult
from kvlab.models import resolve_model
from kvlab.store import Store
from tests.host_limits import could_not_run
from tests.serving import installed_engine_python, kvlab_cli
from tests.waiting import SAFETY_S

pytestmark = pytest.mark.model

FP8 = ["fp8_e4m3", "fp8_e5m2"]
HERE = offer("vllm")
DTYPES = [q for q in FP8 if q in HERE.runs]  # and the baseline ("auto": the model's bfloat16 on the CPU build)
NOT_HERE = {q: HERE.refused[q] for q in FP8 if q not in DTYPES}
SMOLLM2 = CacheGeometry(num_layers=30, num_kv_heads=3, head_dim=64)


def spec_toml(name: str, num_items: int, depths: list[float], server: dict | None = None, **rest: object) -> str:
    """A spec of passkey items at 512 tokens on a vLLM that kvlab launches (and waits for, however busy the host)."""
    return tomli_w.dumps({
        "name": name, "model": "smollm2-135m", **rest,
        "backend": {"kind": "vllm", "server": {"startup_timeout_s": SAFETY_S, **(server or {})}},
        "tasks": [{"name": "passkey", "context_lengths": [512], "depths": depths, "num_items": num_items,
                   "max_new_tokens": 8}],
    })


# the fp8 sweep, or where fp8 cannot run the baseline alone (a spec's one config at the model's own dtype)
CONFIGS = {"sweep": {"quant": DTYPES}} if DTYPES else {"configs": [{"name": "baseline", "quant": "none"}]}
#: One KV budget for every config: 11 blocks of 128 bfloat16 tokens (11 x 128 x 23,040 B = 30.9375 MiB, whole blocks,
#: so the pool's bytes per token are the geometry's) -- 1,408 tokens, two of the items' sequences (about 540 prompt
#: and 16 new tokens: 5 blocks each); fp8 fits 22 blocks, four.  The context is capped at 1,024 tokens: vLLM refuses
#: a pool smaller than one sequence of the model's own (8,192).
LOAD = {"kv_budget_mib": 30.9375, "concurrency": [4], "requests": 8, "output_tokens": 16}
BUDGET_TOKENS = {"baseline": 1_408, **{dtype: 2_816 for dtype in DTYPES}}
MAX_MODEL_LEN = 1024
SPEC = spec_toml("vllm-real", 4, [0.25, 0.75], server={"max_model_len": MAX_MODEL_LEN}, load=LOAD, **CONFIGS)
# The same items on the embedded engine, which runs no load phase (it has no serving scheduler).
EMBEDDED = spec_toml("vllm-real", 4, [0.25, 0.75], **CONFIGS)
# Where fp8 cannot run: the same spec on a second server setting, the weights (and so the cache) in float16.
FLOAT16 = SPEC.replace('kind = "vllm"', 'kind = "vllm"\ndtype = "float16"').replace("vllm-real", "vllm-float16")
KEY = "kvlab-test-key-0123456789"


@pytest.fixture(scope="module")
def vllm_python() -> str:
    return installed_engine_python("vllm")


@pytest.fixture(scope="module")
def runs(vllm_python, tmp_path_factory) -> dict:
    """The sweep on vLLM (experiment 1) and the same spec on the embedded engine (experiment 2), one store."""
    folder = tmp_path_factory.mktemp("vllm-real")
    spec, db = folder / "spec.toml", folder / "kvlab.sqlite"
    spec.write_text(SPEC)
    on_vllm = kvlab_cli("run", str(spec), db=db, cwd=folder)
    assert on_vllm.returncode == 0, on_vllm.stderr[-3000:]
    (folder / "embedded.toml").write_text(EMBEDDED)
    embedded = kvlab_cli("run", str(folder / "embedded.toml"), "--backend", "embedded", db=db, cwd=folder)
    assert embedded.returncode == 0, embedded.stderr[-3000:]
    compared = kvlab_cli("compare", "2", "1", db=db, cwd=folder)
    if NOT_HERE:
        could_not_run(f"vLLM --kv-cache-dtype {', '.join(NOT_HERE)} (test_vllm_real compared the baseline with "
                      f"float16 weights instead)", next(iter(NOT_HERE.values())))
        (folder / "float16.toml").write_text(FLOAT16)
        on_float16 = kvlab_cli("run", str(folder / "float16.toml"), db=db, cwd=folder)
        assert on_float16.returncode == 0, on_float16.stderr[-3000:]
    with Store(f"sqlite:///{db}") as store:
        yield {"vllm": store.item_results(1), "embedded": store.item_results(2), "trials": store.trials(1),
               "load": store.load_levels(1),
               "telemetry": store.telemetry(1), "stdout": on_vllm.stdout, "compare": compared,
               "float16": store.item_results(3) if NOT_HERE else None}


def test_every_config_shows_the_pool_bytes_of_its_own_server(runs):
    results = runs["vllm"]
    assert {r.config_name for r in results} == {"baseline", *DTYPES}
    assert all(r.error is None and r.physical_kv_bytes and r.kv_bytes_estimated for r in results)
    for result in results:
        bits = 16 if result.config_name == "baseline" else 8
        per_token = result.physical_kv_bytes / result.prompt_tokens
        # the pool as vLLM states it: the load's budget holds 1,408 bf16 or 2,816 fp8 tokens (23,040 and 11,520 B/token)
        assert per_token == pytest.approx(SMOLLM2.bytes_per_token(bits), rel=0.01), result.config_name
        assert "cache_config_info" in result.extra["kv_bytes_source"] and ", agree" in result.extra["kv_bytes_source"]
    assert all(r.score == 1.0 for r in results if r.config_name == "baseline")  # the model does the task on vLLM
    table = runs["stdout"].split("KV MiB", 1)[1].split("\n\n", 1)[0].splitlines()[2:]  # the summary's rows
    assert len(table) == 1 + len(DTYPES) and all("≈" in row for row in table), table  # every pool shown, none "-"
    if runs["float16"] is not None:  # the second setting: float16 weights, a 16-bit cache of the same bytes
        assert all(r.error is None and r.kv_bytes_estimated for r in runs["float16"])
        for result in runs["float16"]:
            assert result.physical_kv_bytes / result.prompt_tokens == pytest.approx(SMOLLM2.bytes_per_token(16),
                                                                                    rel=0.01)


def test_the_capacity_projection_of_each_pool_is_what_vllm_states(runs):
    """kvlab capacity's arithmetic against vLLM's own: the pool bytes it was given, its block size and the model's
    geometry give the tokens vLLM states (``kv_cache_size_tokens``) and, where it states it, its maximum concurrency
    at the server's context (``kv_cache_max_concurrency``), within 1%."""
    import re

    from kvlab.capacity.architectures import architecture
    from kvlab.capacity.projection import Pool, project_config

    arch = architecture("smollm2-135m")
    for result in runs["vllm"]:
        stated = dict(re.findall(r"(\w+)=([\w.]+)", result.extra["kv_bytes_source"].split("}", 1)[0]))
        config = KVCacheConfig(quant="none" if result.config_name == "baseline" else result.config_name)
        projected = project_config(config, arch, MAX_MODEL_LEN, Pool(int(stated["kv_cache_memory_bytes"]), "stated"),
                                   server_block=int(stated["block_size"]))
        assert projected.pool_tokens == pytest.approx(int(stated["kv_cache_size_tokens"]), rel=0.01), stated
        if "kv_cache_max_concurrency" in stated:
            assert projected.concurrency == pytest.approx(float(stated["kv_cache_max_concurrency"]), rel=0.01), stated


def test_under_load_a_compressed_pool_runs_more_requests_at_once(runs):
    """The load phase on the real vLLM, every config in the same 30.9 MiB budget: 4 clients, 8 requests of the items'
    prompts.  The baseline's pool holds two of them and queues (or preempts) the rest; fp8's holds twice the tokens
    and runs more at once with a shorter queue.  Counts only: the throughput ratios are benchmarks/load_bench.py's."""
    levels = {level.config_name: level.result for level in runs["load"]}
    assert set(levels) == {"baseline", *DTYPES}
    for name, level in levels.items():
        assert (level["mode"], level["level"], level["completed"], level["errors"]) == ("closed", 4.0, 8, 0), name
        assert level["pool_tokens"] == BUDGET_TOKENS[name] and level["output_tokens"] == 8 * 16, name
        assert level["server"]["samples"] >= 2 and level["server"]["max_running"] >= 1, name
    base = levels["baseline"]["server"]
    assert base["max_running"] <= 3 and base["max_waiting"] + base["preemptions"] >= 1, base
    if not DTYPES:
        could_not_run("more requests at once under vLLM's fp8 KV cache (the baseline alone ran under load here)",
                      next(iter(NOT_HERE.values())))
        return
    for dtype in DTYPES:
        fp8 = levels[dtype]["server"]
        assert fp8["max_running"] > base["max_running"], (dtype, fp8, base)
        assert fp8["max_waiting"] + fp8["preemptions"] < base["max_waiting"] + base["preemptions"], (dtype, fp8, base)
    assert "what each config buys under load" in runs["stdout"]


def test_the_sweep_is_decided_by_fidelity_measured_through_vllm(runs):
    """Each fp8 config's items carry the sampled estimate against the baseline's server (the baseline's continuation
    sampled at temperature 1 and scored on both through prompt_logprobs), and the verdict is fidelity's."""
    if not DTYPES:
        could_not_run("a fidelity decision on vLLM (the sweep holds the baseline alone: no fp8 on this host)",
                      next(iter(NOT_HERE.values())))
        assert all(r.fidelity is None for r in runs["vllm"])
        return
    for result in runs["vllm"]:
        if result.config_name == "baseline":
            assert result.fidelity is None
            continue
        fidelity = result.fidelity
        assert fidelity is not None and fidelity.teacher == TEACHER_BASELINE_SAMPLE, result.extra
        assert fidelity.tokens >= 1 and all(math.isfinite(kl) for kl in fidelity.kl)
    verdicts = runs["stdout"].split("verdict per task", 1)[1].split("\n\n", 1)[0].splitlines()
    for dtype in DTYPES:
        row = next(line for line in verdicts if line.startswith(dtype))
        assert " fidelity " in row and "mean KL" in row, row
    assert "sampled at temperature 1" in runs["stdout"]


def test_the_baseline_server_measures_its_own_noise_floor(runs):
    """vLLM against itself on every baseline item: its sample scored as the items' scoring runs and again afresh
    (a new cache_salt: no cached prefix reused); the floor is printed beside the configs' fidelity."""
    baseline = [r for r in runs["vllm"] if r.config_name == "baseline"]
    assert baseline and all(NOISE_FLOOR_KEY in r.extra for r in baseline), [r.extra.keys() for r in baseline]
    floor = noise_floor(runs["vllm"], "baseline")
    assert floor is not None and floor.summary.items == len(baseline)
    assert all(math.isfinite(kl) for kl in floor.summary.item_mean_kl)
    (line,) = [line for line in runs["stdout"].splitlines() if line.startswith("engine noise floor: mean KL")]
    assert f"over {len(baseline)} items" in line, line


def test_the_baseline_server_measures_its_noise_floor_again_with_the_loads_clients_beside_it(runs):
    """Beside its level of 4 clients, the baseline's vLLM scores its samples afresh once more while 4 clients keep
    it busy (continuous batching: the scoring shares batches with their decodes); stored with that level, printed
    under the quiet floor."""
    (level,) = [LevelResult.from_dict(record.result) for record in runs["load"] if record.config_name == "baseline"]
    assert level.noise_floor is not None, level.noise_floor_note
    floor = floor_under_load(runs["load"], "baseline")
    assert floor is not None and floor.summary.items == len(level.noise_floor) == 4
    assert all(math.isfinite(kl) for kl in floor.summary.item_mean_kl)
    (line,) = [line for line in runs["stdout"].splitlines() if line.startswith("under load, engine noise floor:")]
    assert "over 4 items (scored afresh while 4 clients kept the server busy)" in line, line


def test_the_server_metrics_reach_the_telemetry(runs):
    server = [s for s in runs["telemetry"] if s.source == "server"]
    assert server, "no /metrics sample was stored"
    # vllm:kv_cache_usage_perc x the pool's bytes, on every sample that reached a server
    assert any(s.kv_bytes is not None for s in server)
    assert {s.trial_id for s in server} <= {t.id for t in runs["trials"]} | {None}


def test_the_same_spec_on_two_engines_in_one_table(runs):
    rows = {row.config_name: row for row in engine_agreement(runs["embedded"], runs["vllm"])}
    assert set(rows) == {"baseline", *DTYPES}
    for row in rows.values():
        assert row.items == 4 and row.estimated_b and not row.estimated_a
        # the engines compute in different dtypes (vLLM's CPU build bfloat16, kvlab float32) and their fp8
        # caches differ (one scale per tensor in vLLM; per block of tokens, with a 16-bit residual window, in
        # kvlab), yet at 512 tokens they give the same answers to nearly every passkey item
        assert row.same_outcome >= 0.75 and row.same_text >= 0.5, row
    # 16-bit caches of the same tokens: the same bytes per token, measured here and stated by vLLM
    assert rows["baseline"].kv_bytes_b == pytest.approx(rows["baseline"].kv_bytes_a, rel=0.01)
    for dtype in DTYPES:  # vLLM's fp8 is one byte an element; kvlab's adds scales and the residual window
        assert rows[dtype].kv_bytes_b == pytest.approx(SMOLLM2.bytes_per_token(8), rel=0.01)
        assert rows[dtype].kv_bytes_a > rows[dtype].kv_bytes_b
    for dtype in DTYPES:  # each engine's config against its own baseline, each with its own estimator
        assert rows[dtype].fidelity_a.teacher == TEACHER_BASELINE_OUTPUT, rows[dtype]
        assert rows[dtype].fidelity_b.teacher == TEACHER_BASELINE_SAMPLE and rows[dtype].fidelity_b.items == 4
    table = runs["compare"]
    assert table.returncode == 0, table.stderr
    assert "same outcome" in table.stdout and all(name in table.stdout for name in rows)
    assert "mean KL A [95% CI]" in table.stdout
    # vLLM's baseline kept its sampled continuations; the embedded float32 model scores them: the floor
    (floor,) = [line for line in table.stdout.splitlines() if line.startswith("baselines: KL(vllm #1's baseline")]
    agreement = float(floor.split("top-1 agreement ", 1)[1].split("%", 1)[0])
    assert "over 4 items" in floor and agreement >= 50, floor  # the same weights in bfloat16 and in float32
    if runs["float16"] is not None:  # two settings of one server: bfloat16 and float16 weights
        (row,) = engine_agreement(runs["vllm"], runs["float16"])
        assert row.items == 4 and row.same_outcome >= 0.75 and row.estimated_a and row.estimated_b, row
        assert row.kv_bytes_a == pytest.approx(row.kv_bytes_b, rel=0.01)


@pytest.fixture(scope="module")
def keyed_server(vllm_python, tmp_path_factory):
    """A vLLM serving the default model with an API key (``VLLM_API_KEY``, never on the command line)."""
    installed = Installed(vllm_python, cpu_build=True, threads=2)
    port = free_port()
    command = server_command("vllm", str(resolve_model("smollm2-135m")), KVCacheConfig(), ServerOptions(), port,
                             "smollm2-135m", installed=installed)
    log = tmp_path_factory.mktemp("keyed") / "vllm.log"
    env = server_env("vllm", installed, local_model=True) | {"VLLM_API_KEY": KEY}
    with ManagedServer(command, f"http://127.0.0.1:{port}/health", log, env=env, startup_timeout_s=SAFETY_S):
        yield f"http://127.0.0.1:{port}/v1"


def test_doctor_passes_a_live_vllm_and_names_a_wrong_key(keyed_server):
    report = diagnose(keyed_server, "smollm2-135m", KEY, timeout_s=60, key_source="environment variable KVLAB_API_KEY")
    assert report.ok and all(check.status == "ok" for check in report.checks), report.to_text()
    wrong = diagnose(keyed_server, "smollm2-135m", "not-the-key-at-all", timeout_s=60,
                     key_source="environment variable KVLAB_API_KEY")
    auth = next(check for check in wrong.checks if check.name == "auth")
    assert auth.status == "fail" and "HTTP 401" in auth.detail and "KVLAB_API_KEY" in auth.fix
    assert "not-the-key-at-all" not in wrong.to_text()


def test_the_playground_on_a_live_vllm_sizes_the_item_by_its_tokenizer_and_estimates_its_cache(keyed_server,
                                                                                                 monkeypatch, smollm):
    """The playground's endpoint mode on the real server: the passkey item generated through vLLM's /tokenize is
    the one kvlab's own tokenizer generates; one answer, its timings, and the cache it held as an estimate (the
    pool's bytes per token: vLLM's /metrics, else the model's geometry at the server's cache dtype)."""
    from kvlab.dashboard.endpoint_playground import run_on_endpoint
    from kvlab.dashboard.playground import PlaygroundView
    from kvlab.tasks.single import generated_item

    monkeypatch.setenv("KVLAB_API_KEY", KEY)
    monkeypatch.setenv("KVLAB_BASE_URL", keyed_server)  # the URL the key belongs to: a page sends it there alone
    view = PlaygroundView(engine="endpoint", base_url=keyed_server, length=512, seed=1)
    answer = run_on_endpoint(view.item(), "smollm2-135m", view.base_url, None, max_new_tokens=8)
    local = generated_item("passkey", 512, 0.5, 1, smollm.tokenizer)
    assert (answer["item"]["context"], answer["item"]["question"]) == (local.context, local.question)
    (result,) = answer["results"]
    assert result["config"] == "smollm2-135m's cache (baseline)" and result["score"] in (0.0, 1.0)
    assert result["ttft_s"] > 0 and result["output_tokens"] >= 1 and result["kv_estimated"]
    assert result["context_tokens"] >= 500
    stated = "vllm:cache_config_info" in result["kv_source"]  # bytes as vLLM states them, else the geometry's
    expected = SMOLLM2.bytes_per_token(16) * result["context_tokens"]
    assert result["physical_bytes"] == pytest.approx(expected, rel=0.01 if stated else 1e-9), result["kv_source"]
    wrong = view.item() | {"context_length": 9000}  # over vLLM's max_model_len: the server's refusal, one line
    with pytest.raises(Exception, match="refused the item"):
        run_on_endpoint(wrong, "smollm2-135m", view.base_url, None)


# The tune decides by fidelity measured through vLLM (the sampled estimator); 8 items of 8 sampled tokens cannot
# certify mean KL below 0.05, so its test checks the search and the flag it ends in at loose margins (max_kl 0.5,
# max_drop 0.5), not the power of its decision.
TUNE = spec_toml("vllm-tune", 8, [0.5], max_drop=0.5, max_kl=0.5,
                 tune={"quant": ["none", "int4", *FP8], "min_items": 8, "candidates_per_round": 2, "max_trials": 2})


def test_a_tune_on_vllm_searches_its_kv_dtypes_and_ends_in_the_exact_flag(vllm_python, tmp_path):
    spec, out = tmp_path / "tune.toml", tmp_path / "tune.json"
    spec.write_text(TUNE)
    tuned = kvlab_cli("tune", str(spec), "--json", str(out), db=tmp_path / "kvlab.sqlite", cwd=tmp_path)
    if NOT_HERE:  # vLLM has no KV dtype but fp8 to search: the tune is refused in one line, before any server
        could_not_run("a tune over vLLM's fp8 KV dtypes (test_vllm_real checked its refusal)",
                      next(iter(NOT_HERE.values())))
        assert tuned.returncode == 2, tuned.stderr[-3000:]
        (line,) = [line for line in tuned.stderr.splitlines() if line.startswith("error:")]
        assert "cannot run here" in line and "AVX-512 or AMX" in line, tuned.stderr
        assert not out.exists()
        return
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    assert "vllm has no KV cache like int4: left out of the search" in tuned.stdout + tuned.stderr
    answer = json.loads(out.read_text())
    dtype = answer["config"]["quant"]
    assert dtype in DTYPES, answer
    assert answer["engines"]["vllm"]["flag"] == f"--kv-cache-dtype {dtype}"
    assert f"--kv-cache-dtype {dtype}" in tuned.stdout


def test_16bit_layers_launch_with_vllms_flag_and_its_pool_follows_the_mixed_geometry(vllm_python, tmp_path):
    """fp8 with the first and last 2 layers 16-bit: vLLM's --kv-cache-dtype-skip-layers 0 1 28 29, and its pool's
    bytes per token are 26 fp8 layers and 4 bfloat16 ones (13,056 B/token by the geometry)."""
    if "fp8_e4m3" not in DTYPES:
        could_not_run("vLLM's 16-bit layers under an fp8 cache (--kv-cache-dtype-skip-layers)",
                      next(iter(NOT_HERE.values())))
        return
    spec = tmp_path / "skip.toml"
    spec.write_text(spec_toml("vllm-skip", 1, [0.5], configs=[
        {"name": "baseline"}, {"name": "fp8-16b", "quant": "fp8_e4m3", "skip_layers": {"first": 2, "last": 2}}]))
    ran = kvlab_cli("run", str(spec), "--json", str(tmp_path / "out.json"), db=tmp_path / "kvlab.sqlite", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    results = {r["config_name"]: r for r in json.loads((tmp_path / "out.json").read_text())["results"]}
    skipped = results["fp8-16b"]
    per_token = skipped["physical_kv_bytes"] / skipped["prompt_tokens"]
    assert per_token == pytest.approx(SMOLLM2.bytes_per_token(8, layers_16bit=4), rel=0.01)
    source = skipped["extra"]["kv_bytes_source"]
    assert "+ 4 16-bit layers" in source and ", agree" in source, source
    launches = json.loads((tmp_path / "out.json").read_text())["engine"]["launches"]
    command = next(launch["command"] for launch in launches if launch["config"] == "fp8-16b")
    flag = command.index("--kv-cache-dtype-skip-layers")
    assert command[flag + 1:flag + 5] == ["0", "1", "28", "29"]
    assert skipped["extra"]["fidelity"]["teacher"] == TEACHER_BASELINE_SAMPLE
