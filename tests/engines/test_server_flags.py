"""Command lines for vLLM / SGLang servers: exact argv, refusals that name what the engine supports."""

from __future__ import annotations

import pytest

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ServerOptions
from kvlab.core.formats import engine_dtypes
from kvlab.core.kv_config import KVCacheConfig
from kvlab.engines.server_flags import (
    check_config,
    health_path,
    server_command,
)

FP8 = KVCacheConfig(name="fp8", quant="fp8_e4m3")
BASELINE = KVCacheConfig(name="baseline")


def test_engine_kv_dtypes_map_kvlab_names_to_engine_values():
    expected = {"none": "auto", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
    assert engine_dtypes("vllm") == expected
    assert engine_dtypes("sglang") == expected


def test_vllm_argv_defaults():
    argv = server_command("vllm", "/models/llama", BASELINE, ServerOptions(), 8123, "kvlab-model")
    assert argv == [
        "python", "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", "8123",
        "--model", "/models/llama", "--kv-cache-dtype", "auto",
        "--served-model-name", "kvlab-model", "--seed", "0",
    ]


def test_vllm_argv_with_every_option():
    options = ServerOptions(python="/opt/vllm/bin/python", host="0.0.0.0", memory_fraction=0.85,
                            max_model_len=8192, prefix_cache=False, extra_args=["--enforce-eager"])
    argv = server_command("vllm", "Qwen/Qwen2.5-0.5B", FP8, options, 9000, "m", seed=7)
    assert argv == [
        "/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--host", "0.0.0.0",
        "--port", "9000", "--model", "Qwen/Qwen2.5-0.5B", "--kv-cache-dtype", "fp8_e4m3",
        "--gpu-memory-utilization", "0.85", "--max-model-len", "8192", "--no-enable-prefix-caching",
        "--served-model-name", "m", "--seed", "7", "--enforce-eager",
    ]


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
    ("sglang", "--context-length", "server.max_model_len"),
    ("sglang", "--port", "server.port"),
])
def test_extra_args_may_not_override_flags_kvlab_sets(kind, flag, owner):
    with pytest.raises(ConfigError, match=owner):
        server_command(kind, "/m", FP8, ServerOptions(extra_args=[flag, "1"]), 8000, "m")


def test_bad_kind_and_port_are_refused():
    with pytest.raises(ConfigError, match="vllm and sglang"):
        server_command("tgi", "/m", FP8, ServerOptions(), 8000, "m")
    with pytest.raises(ConfigError, match="1..65535"):
        server_command("vllm", "/m", FP8, ServerOptions(), 0, "m")


def test_health_paths():
    assert health_path("vllm") == "/health"
    assert health_path("sglang") == "/health_generate"
