"""Command lines for vLLM / SGLang servers: exact argv, refusals that name what the engine supports."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvlab.core.backends import BACKENDS
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ServerOptions
from kvlab.core.formats import FORMATS
from kvlab.core.kv_config import KVCacheConfig
from kvlab.engines.server_flags import check_config, health_path, server_command, server_env
from kvlab.engines.servers.installs import Installed
from kvlab.threads import CHOSEN_BY_KVLAB, SLEEP_AT_ONCE, WAIT_POLICY_VARS

FP8 = KVCacheConfig(name="fp8", quant="fp8_e4m3")
BASELINE = KVCacheConfig(name="baseline")


def test_engine_kv_dtypes_map_kvlab_names_to_engine_values():
    common = {"none": "auto", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
    for kind, own in (("vllm", {"turboquant_k8v4", "int8_per_token_head", "nvfp4", "fp8_inc"}),
                      ("sglang", {"mxfp8", "nvfp4", "fp4_e2m1"})):
        dtypes = BACKENDS[kind].kv_dtypes
        assert dtypes.items() >= common.items() and own <= set(dtypes)
        # an engine's own dtype is named as the engine names it
        assert all(dtypes[name] == name for name in dtypes if FORMATS[name].kind == "engine")


def test_vllm_argv_defaults():
    argv = server_command("vllm", "/models/llama", BASELINE, ServerOptions(), 8123, "kvlab-model")
    assert argv == [
        "python", "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", "8123",
        "--model", "/models/llama", "--kv-cache-dtype", "auto",
        "--served-model-name", "kvlab-model", "--seed", "0",
    ]


def test_vllm_argv_with_every_option():
    options = ServerOptions(python="/opt/vllm/bin/python", host="0.0.0.0", memory_fraction=0.85, max_model_len=8192,
                            prefix_cache=False, enforce_eager=True, extra_args=["--block-size", "16"])
    argv = server_command("vllm", "Qwen/Qwen2.5-0.5B", FP8, options, 9000, "m", seed=7, dtype="bfloat16")
    assert argv == [
        "/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--host", "0.0.0.0",
        "--port", "9000", "--model", "Qwen/Qwen2.5-0.5B", "--kv-cache-dtype", "fp8_e4m3", "--dtype", "bfloat16",
        "--gpu-memory-utilization", "0.85", "--max-model-len", "8192", "--no-enable-prefix-caching",
        "--enforce-eager", "--served-model-name", "m", "--seed", "7", "--block-size", "16",
    ]


CPU_BUILD = Installed("/home/u/.cache/kvlab/engines/vllm/bin/python", cpu_build=True, threads=2)


def test_vllm_cpu_build_sizes_its_pool_and_starts_eagerly_by_default():
    """On a CPU, --gpu-memory-utilization is a fraction of host memory and its default 0.92 fails at
    start-up; graph compilation takes minutes and does not reload."""
    argv = server_command("vllm", "/m", FP8, ServerOptions(), 8000, "m", installed=CPU_BUILD)
    assert argv[0] == CPU_BUILD.python
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(1 << 30) and "--enforce-eager" in argv
    assert "--gpu-memory-utilization" not in argv


def test_vllm_pool_size_and_eagerness_are_the_users_to_choose():
    argv = server_command("vllm", "/m", FP8, ServerOptions(kv_cache_gib=2.5, enforce_eager=False), 8000, "m",
                          installed=CPU_BUILD)
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(round(2.5 * (1 << 30)))
    assert "--enforce-eager" not in argv
    argv = server_command("vllm", "/m", FP8, ServerOptions(memory_fraction=0.3), 8000, "m", installed=CPU_BUILD)
    assert "--kv-cache-memory-bytes" not in argv and argv[argv.index("--gpu-memory-utilization") + 1] == "0.3"
    with pytest.raises(ValidationError, match="memory_fraction or kv_cache_gib, not both"):
        ServerOptions(memory_fraction=0.3, kv_cache_gib=1)


def test_sglang_refuses_the_vllm_only_options():
    with pytest.raises(ConfigError, match="SGLang sizes its KV pool by a fraction"):
        server_command("sglang", "/m", FP8, ServerOptions(kv_cache_gib=1), 8000, "m")
    with pytest.raises(ConfigError, match="server.enforce_eager = true: SGLang has no such option"):
        server_command("sglang", "/m", FP8, ServerOptions(enforce_eager=True), 8000, "m")


def test_the_cpu_build_runs_unpinned_threads_and_a_local_model_offline(monkeypatch):
    for name in (*WAIT_POLICY_VARS, CHOSEN_BY_KVLAB):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(CHOSEN_BY_KVLAB, "1")  # kvlab chose a spin for itself: a server still sleeps when idle
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    quiet = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"} | SLEEP_AT_ONCE | {CHOSEN_BY_KVLAB: ""}
    assert server_env("vllm", CPU_BUILD, local_model=True) == quiet | {
        "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "2"}
    assert server_env("vllm", Installed("python"), local_model=False) == quiet
    assert server_env("sglang", Installed("python"), local_model=False) == {
        "DO_NOT_TRACK": "1"} | SLEEP_AT_ONCE | {CHOSEN_BY_KVLAB: ""}
    monkeypatch.delenv(CHOSEN_BY_KVLAB)  # the user's own policy: the server inherits it, nothing added
    assert server_env("sglang", Installed("python"), local_model=False) == {"DO_NOT_TRACK": "1"}


def test_sglang_argv_defaults():
    argv = server_command("sglang", "/models/llama", BASELINE, ServerOptions(), 30001, "kvlab-model")
    assert argv == [
        "python", "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", "30001",
        "--model-path", "/models/llama", "--kv-cache-dtype", "auto",
        "--enable-metrics", "--served-model-name", "kvlab-model", "--random-seed", "0",
    ]


def test_sglang_argv_with_every_option():
    options = ServerOptions(memory_fraction=0.7, max_model_len=4096, prefix_cache=False,
                            extra_args=["--attention-backend", "triton"])
    config = KVCacheConfig(name="e5m2", quant="fp8_e5m2")
    argv = server_command("sglang", "/m", config, options, 30002, "served", seed=3)
    assert argv == [
        "python", "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", "30002",
        "--model-path", "/m", "--kv-cache-dtype", "fp8_e5m2", "--mem-fraction-static", "0.7",
        "--context-length", "4096", "--disable-radix-cache", "--enable-metrics",
        "--served-model-name", "served", "--random-seed", "3", "--attention-backend", "triton",
    ]


def test_fp8_alias_reaches_the_engines_as_e4m3():
    config = KVCacheConfig(quant="fp8")  # kvlab's canonical name for plain fp8 is fp8_e4m3
    argv = server_command("sglang", "/m", config, ServerOptions(), 30003, "m")
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3"


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_raw_plain_fp8_is_refused(kind):
    config = KVCacheConfig.model_construct(**{**BASELINE.model_dump(), "quant": "fp8", "name": "raw"})
    with pytest.raises(ConfigError, match="fp8_e4m3 or fp8_e5m2"):
        check_config(kind, config)


@pytest.mark.parametrize(("quant", "named"), [
    ("int8", ["fp8_e4m3", "fp8_e5m2", "int8_per_token_head"]),
    ("int4", ["int4_per_token_head", "nvfp4", "turboquant_4bit_nc"]),
    ("int2", ["no 2-bit", "turboquant_3bit_nc"]),
])
def test_vllm_refuses_kivi_integer_quantization_naming_its_formats(quant, named):
    with pytest.raises(ConfigError) as error:
        check_config("vllm", KVCacheConfig(name="q", quant=quant))
    message = str(error.value)
    assert f"quant = '{quant}'" in message and "vLLM" in message
    assert "none, fp8_e4m3, fp8_e5m2" in message and "embedded" in message
    for name in named:
        assert name in message


@pytest.mark.parametrize(("quant", "named"), [
    ("int8", ["fp8_e4m3", "fp8_e5m2", "mxfp8"]),
    ("int4", ["nvfp4", "fp4_mx_block16", "fp4_e2m1"]),
    ("int2", ["no 2-bit"]),
])
def test_sglang_refuses_kivi_integer_quantization_naming_its_formats(quant, named):
    with pytest.raises(ConfigError) as error:
        check_config("sglang", KVCacheConfig(name="q", quant=quant))
    message = str(error.value)
    assert "SGLang" in message and "none, fp8_e4m3, fp8_e5m2" in message
    for name in named:
        assert name in message


@pytest.mark.parametrize(("kind", "knobs"), [
    ("vllm", ["--no-enable-prefix-caching", "--gpu-memory-utilization", "server.prefix_cache"]),
    ("sglang", ["--disable-radix-cache", "--radix-eviction-policy", "--mem-fraction-static"]),
])
def test_token_eviction_is_refused_naming_the_prefix_cache_knobs(kind, knobs):
    config = KVCacheConfig(name="snap", evict="snapkv", ratio=0.5)
    with pytest.raises(ConfigError, match="does not evict tokens") as error:
        check_config(kind, config)
    for knob in knobs:
        assert knob in str(error.value)
    with pytest.raises(ConfigError):
        server_command(kind, "/m", config, ServerOptions(), 8000, "m")


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_api_key_never_reaches_the_command_line(kind, monkeypatch):
    monkeypatch.setenv("KVLAB_API_KEY", "sk-secret-123")
    argv = server_command(kind, "/m", FP8, ServerOptions(), 8000, "m")
    assert not any("sk-secret" in arg or "api-key" in arg for arg in argv)
    for extra in (["--api-key", "sk-secret-123"], ["--api-key=sk-secret-123"]):
        with pytest.raises(ConfigError, match="visible to every user"):
            server_command(kind, "/m", FP8, ServerOptions(extra_args=extra), 8000, "m")


@pytest.mark.parametrize(("kind", "flag", "owner"), [
    ("vllm", "--kv-cache-dtype=fp8", "the config's quant"),
    ("vllm", "--gpu-memory-utilization", "server.memory_fraction"),
    ("vllm", "--kv-cache-memory-bytes", "server.kv_cache_gib"),
    ("vllm", "--enforce-eager", "server.enforce_eager"),
    ("sglang", "--context-length", "server.max_model_len"),
    ("sglang", "--port", "server.port"),
])
def test_extra_args_may_not_override_flags_kvlab_sets(kind, flag, owner):
    with pytest.raises(ConfigError, match=owner):
        server_command(kind, "/m", FP8, ServerOptions(extra_args=[flag, "1"]), 8000, "m")


def test_bad_kind_and_port_are_refused():
    with pytest.raises(ConfigError, match="vllm, sglang, llamacpp"):
        server_command("tgi", "/m", FP8, ServerOptions(), 8000, "m")
    with pytest.raises(ConfigError, match="1..65535"):
        server_command("vllm", "/m", FP8, ServerOptions(), 0, "m")


def test_health_paths():
    assert health_path("vllm") == "/health"
    assert health_path("sglang") == "/health_generate"


def test_vllm_launches_16bit_layers_with_its_flag_and_sglang_refuses_them():
    config = KVCacheConfig(quant="fp8_e4m3", skip_layers={"first": 2, "last": 1, "layers": [7]})
    argv = server_command("vllm", "m", config, ServerOptions(), 8000, "m", num_layers=30)
    flag = argv.index("--kv-cache-dtype-skip-layers")
    assert argv[flag + 1:flag + 5] == ["0", "1", "7", "29"] and argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    with pytest.raises(ConfigError, match="layer count"):  # the last layers need the model's depth
        server_command("vllm", "m", config, ServerOptions(), 8000, "m")
    with pytest.raises(ConfigError, match="names layer 7, but the model has 4"):
        server_command("vllm", "m", config, ServerOptions(), 8000, "m", num_layers=4)
    with pytest.raises(ConfigError, match="SGLang.*no flag that keeps some layers"):
        check_config("sglang", config)
