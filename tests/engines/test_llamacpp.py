"""llama.cpp without its server: the argv kvlab launches, K and V types checked against what it stores, the pool line
its log writes, the bytes of its block formats, the flags a recommendation names, the tune's space on it."""

from __future__ import annotations

import pytest

from kvlab.compress.accounting import check_fits, kv_bits
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ServerOptions
from kvlab.core.formats import FORMATS, KVLAB_QUANT_NAMES
from kvlab.core.geometry import CacheGeometry
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tune_spec import TuneSpec, backend_space
from kvlab.engines.launched import pool_check
from kvlab.engines.server_flags import check_config, server_command, server_env
from kvlab.engines.servers import serving_engine
from kvlab.engines.servers.installs import Installed
from kvlab.engines.servers.llamacpp import GGML_TYPES
from kvlab.tune.recommend import engine_flag

LLAMACPP = serving_engine("llamacpp")
SMOLLM2 = CacheGeometry(num_layers=30, num_kv_heads=3, head_dim=64)
# src/llama-kv-cache.cpp, the format string of the pool line (llama.cpp as llama-cpp-python 0.3.36 vendors it)
POOL_FORMAT = ("llama_kv_cache: size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs), K (%s): %7.2f MiB, "
               "V (%s): %7.2f MiB\n")


def test_argv_sets_both_cache_types_flash_attention_and_the_logits_fidelity_reads():
    config = KVCacheConfig(quant="q8_0", value_quant="q4_0")
    argv = server_command("llamacpp", "/m/SmolLM2.gguf", config, ServerOptions(max_model_len=4096), 8123, "smol",
                          seed=3, installed=Installed("/venv/bin/python", threads=2))
    assert argv[:3] == ["/venv/bin/python", "-P", str(LLAMACPP.entry()[1])]
    assert argv[3:] == ["--host", "127.0.0.1", "--port", "8123", "--model", "/m/SmolLM2.gguf", "--model_alias", "smol",
                        "--type_k", "8", "--type_v", "2", "--flash_attn", "true", "--logits_all", "true",
                        "--n_ctx", "4096", "--n_threads", "2", "--n_threads_batch", "2", "--seed", "3",
                        "--verbose", "true", "--interrupt_requests", "false"]


def test_the_baseline_is_llamacpps_default_f16_with_the_same_attention():
    argv = server_command("llamacpp", "/m.gguf", KVCacheConfig(), ServerOptions(), 8000, "m")
    assert argv[argv.index("--type_k") + 1] == argv[argv.index("--type_v") + 1] == str(GGML_TYPES["f16"])
    assert argv[argv.index("--flash_attn") + 1] == "true"


@pytest.mark.parametrize(("config", "words"), [
    (KVCacheConfig(quant="int8"), "its 8-bit cache type is q8_0"),
    (KVCacheConfig(quant="q8_0", value_quant="int4"), "value_quant = 'int4'"),
    (KVCacheConfig(quant="fp8_e4m3"), "it has no fp8 KV cache type"),
    (KVCacheConfig(evict="snapkv", ratio=0.5), "does not evict tokens"),
])
def test_what_llamacpp_does_not_store_is_refused_naming_what_it_does(config, words):
    with pytest.raises(ConfigError, match=words):
        check_config("llamacpp", config)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_other_servers_refuse_llamacpps_types_and_name_the_backend_that_runs_them(kind):
    with pytest.raises(ConfigError, match="llama.cpp's own block format.*backend kind 'llamacpp'"):
        check_config(kind, KVCacheConfig(quant="q4_0"))


def test_kvlabs_own_cache_refuses_llamacpps_types():
    problem = check_fits(KVCacheConfig(quant="int8", value_quant="q4_1"), SMOLLM2)
    assert problem and "q4_1 is llama.cpp's own KV cache format" in problem and "'llamacpp'" in problem
    assert all(FORMATS[name].kind != "ggml" for name in KVLAB_QUANT_NAMES)


@pytest.mark.parametrize("option", [{"memory_fraction": 0.5}, {"kv_cache_gib": 1.0}, {"enforce_eager": True},
                                    {"prefix_cache": False}])
def test_server_options_llamacpp_has_no_flag_for_are_refused(option):
    with pytest.raises(ConfigError, match="llama"):
        server_command("llamacpp", "/m.gguf", KVCacheConfig(), ServerOptions(**option), 8000, "m")


@pytest.mark.parametrize(("name", "block_bytes"), [("q8_0", 34), ("q5_1", 24), ("q5_0", 22), ("q4_1", 20),
                                                    ("q4_0", 18), ("iq4_nl", 18)])
def test_block_formats_store_their_scales_inside_the_block(name, block_bytes):
    """ggml/src/ggml-common.h: 32 values per block, a float16 scale (and minimum) among the block's bytes."""
    assert FORMATS[name].bits_per_value == block_bytes * 8 / 32


@pytest.mark.parametrize(("key", "value"), [("none", "none"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0")])
def test_the_pool_line_is_read_and_agrees_with_the_hand_formula(key, value):
    """A pool of 4096 cells as llama.cpp sizes it: each K and V row of a layer is 3 heads x 64 values in blocks."""
    cells = 4096
    row_bytes = {k: 3 * 64 * (2 if k == "none" else FORMATS[k].bits_per_value / 8) for k in (key, value)}
    k_mib, v_mib = (30 * cells * row_bytes[k] / (1 << 20) for k in (key, value))
    names = {"none": "f16"}
    line = POOL_FORMAT % (k_mib + v_mib, cells, 30, 1, 1, names.get(key, key), k_mib, names.get(value, value), v_mib)
    pool = LLAMACPP.parse_pool("llama_context: n_ctx = 4096\n" + line + "llama_context: CPU  output buffer size\n")
    assert pool is not None and pool.tokens == cells
    assert pool.cache_dtype == f"K {names.get(key, key)}, V {names.get(value, value)}"
    config = KVCacheConfig(quant=key, **({"value_quant": value} if value != key else {}))
    check = pool_check(SMOLLM2, pool.bytes_per_token, kv_bits(config))
    assert "agree" in check and "DISAGREE" not in check, check


def test_the_rotation_llama_cpp_chose_is_read_with_its_pool_from_the_last_start():
    """src/llama-kv-cache.cpp logs whether it rotates quantized keys and values after the pool's line; a restart's
    log holds the earlier start's lines before the last pool's."""
    first = POOL_FORMAT % (45.0, 2048, 30, 1, 1, "f16", 22.5, "f16", 22.5)
    last = POOL_FORMAT % (18.28, 2048, 30, 1, 1, "q8_0", 11.95, "q4_0", 6.33)
    log = (first + "llama_kv_cache: attn_rot_k = 0, n_embd_head_k_all = 64\n"
           "llama_kv_cache: attn_rot_v = 0, n_embd_head_k_all = 64\n" + last +
           "llama_kv_cache: attn_rot_k = 1, n_embd_head_k_all = 64\n"
           "llama_kv_cache: attn_rot_v = 1, n_embd_head_k_all = 64\n")
    pool = LLAMACPP.parse_pool(log)
    assert pool is not None and pool.chosen == {"attn_rot_k": "1", "attn_rot_v": "1"}
    assert pool.chosen_text == "attn_rot_k=1, attn_rot_v=1"
    assert LLAMACPP.parse_pool(first).chosen == {}  # a build that logs no rotation: nothing claimed


def test_no_pool_line_gives_none():
    assert LLAMACPP.parse_pool("llama_model_loader: loaded meta data\n") is None


def test_a_recommendation_names_llama_servers_own_flags():
    flag = engine_flag("llamacpp", KVCacheConfig(quant="q8_0", value_quant="q4_0"))
    assert flag["flag"] == "--cache-type-k q8_0 --cache-type-v q4_0 -fa on"
    assert engine_flag("llamacpp", KVCacheConfig(quant="int4"))["flag"] is None


def test_the_tune_searches_llamacpps_key_and_value_types_only():
    tune = TuneSpec(quant=["none", "q8_0", "q4_0", "int8"], value_quant=["q4_0", "int4"], evict=["none", "snapkv"],
                    max_trials=8)
    narrowed, notes = backend_space(tune, "llamacpp")
    assert narrowed.quant == ["none", "q8_0", "q4_0"] and narrowed.value_quant == ["q4_0"]
    assert narrowed.evict == ["none"]
    assert any("int8" in note for note in notes) and any("int4" in note for note in notes)
    labels = {point.get("quant", "none") + "/" + str(point.get("value_quant")) for point in narrowed.space().points()}
    assert "q8_0/q4_0" in labels and "q4_0/None" in labels


def test_the_embedded_tune_leaves_llamacpps_types_out_and_says_so():
    narrowed, notes = backend_space(TuneSpec(quant=["int8", "q4_0"], max_trials=4), "embedded")
    assert narrowed.quant == ["int8"] and notes == ["embedded has no KV cache like q4_0: left out of the search"]


# Issue 47 row 9: "[backend.server] max_model_len = 128 (or 256) with passkey context_lengths = [256] passes
# validation; the server raises `Requested tokens (256) exceed context window` inside a streamed 200 and the run makes
# no progress for 180 s".
ROW_9_SPEC = """
name = "row-9"
model = "smollm2-135m"
[backend]
kind = "{kind}"
[backend.server]
max_model_len = {max_model_len}
[[tasks]]
name = "passkey"
context_lengths = [256]
num_items = 1
[[configs]]
name = "baseline"
"""


@pytest.mark.parametrize("kind", ["llamacpp", "vllm", "sglang"])
@pytest.mark.parametrize("max_model_len", [128, 256])
def test_a_pool_smaller_than_the_longest_prompt_and_its_new_tokens_is_refused_by_the_spec(kind, max_model_len):
    import tomllib

    from pydantic import ValidationError

    from kvlab.core.experiment_spec import ExperimentSpec, format_validation_error

    with pytest.raises(ValidationError) as refused:
        ExperimentSpec.model_validate(tomllib.loads(ROW_9_SPEC.format(kind=kind, max_model_len=max_model_len)))
    (line,) = format_validation_error(refused.value).splitlines()
    assert line.startswith("tasks.0.context_lengths: [256] exceed server.max_model_len = ")
    assert "new tokens" in line and "a larger server.max_model_len" in line, line


def test_kvlab_run_refuses_it_before_launching_in_one_line_exit_2(tmp_path):
    from tests.serving import kvlab_cli

    (tmp_path / "row9.toml").write_text(ROW_9_SPEC.format(kind="llamacpp", max_model_len=128))
    ran = kvlab_cli("run", "row9.toml", "--no-store", db=tmp_path / "kvlab.sqlite", cwd=tmp_path)
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr[-2000:]
    (line,) = [line for line in ran.stderr.splitlines() if line.strip()]  # the one line, before any header
    assert line.startswith("error: ") and "server.max_model_len = 128" in line, line


def test_a_files_prompt_longer_than_the_pool_is_refused_before_launch_in_one_line_exit_2(tmp_path):
    """A file's prompts are measured once tokenized (their lengths are not in the spec): refused after the items
    are built, before any server is launched."""
    import json

    from tests.serving import kvlab_cli

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"context": "The sky is blue. " * 60, "question": "\nColour:", "answer": "blue"})
                    + "\n" + json.dumps({"context": "Short.", "question": "\nA:", "answer": "b"}) + "\n")
    spec = ROW_9_SPEC.format(kind="llamacpp", max_model_len=128).replace(
        'name = "passkey"\ncontext_lengths = [256]\nnum_items = 1', f'name = "jsonl"\npath = "{rows}"')
    (tmp_path / "file.toml").write_text(spec)
    ran = kvlab_cli("run", "file.toml", "--no-store", db=tmp_path / "kvlab.sqlite", cwd=tmp_path)
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr[-2000:]
    (line,) = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert "exceed server.max_model_len = 128" in line and "new tokens" in line, line
    assert "launch" not in (ran.stdout + ran.stderr).lower()


def test_rotation_off_is_llamacpps_environment_switch_and_refused_where_no_engine_has_it():
    """A config's rotation = false reaches llama.cpp as LLAMA_ATTN_ROT_DISABLE=1 in its server's environment (and in
    the recommendation's deploy line); the label says it; an engine without the setting, or kvlab's own engine,
    refuses it in one line naming where it runs; an unquantized config has nothing to rotate."""
    norot = KVCacheConfig(quant="q4_0", rotation=False)
    assert norot.label == "q4_0/norot"
    assert server_env("llamacpp", Installed("python"), local_model=True, config=norot)["LLAMA_ATTN_ROT_DISABLE"] == "1"
    assert "LLAMA_ATTN_ROT_DISABLE" not in server_env("llamacpp", Installed("python"), local_model=True,
                                                      config=KVCacheConfig(quant="q4_0"))
    assert engine_flag("llamacpp", norot)["flag"] == ("--cache-type-k q4_0 --cache-type-v q4_0 -fa on with "
                                                       "LLAMA_ATTN_ROT_DISABLE=1 in its environment")
    with pytest.raises(ConfigError, match="rotation = false cannot run on vLLM.*backend kind 'llamacpp'"):
        check_config("vllm", KVCacheConfig(quant="fp8_e4m3", rotation=False))
    problem = check_fits(KVCacheConfig(quant="int4", rotation=False), SMOLLM2)
    assert problem and "unrotated unless rotation = true" in problem and "'llamacpp'" in problem
    assert check_fits(KVCacheConfig(quant="int4", rotation=True), SMOLLM2) is None  # kvlab's own rotation
    with pytest.raises(ValueError, match="rotation applies to quantized keys or values"):
        KVCacheConfig(rotation=False)
