"""Load benchmark: what compression buys on a real vLLM, and whether kvlab's load client reads it as vLLM's own does.

For each KV dtype this host's vLLM stores (the baseline, and fp8_e4m3 where the CPU has AVX-512 or AMX), one server
in the same KV budget (``--kv-cache-memory-bytes``), and on it, side by side in one run:
  (a) kvlab's load phase (:func:`kvlab.load.client.run_level`) with the passkey items' prompts at N clients;
  (b) vLLM's own client (``vllm.benchmarks.serve``, in vLLM's venv) at the same clients, requests, output tokens
      and ``--ignore-eos``, its random prompts as long as the items' on average.
It prints each client's output tokens/s, requests/s, TTFT (mean, p99) and TPOT (mean), the ratio kvlab / vLLM of
each, and per client the ratio fp8 / baseline: the throughput compression buys, read by both.

With ``--again`` kvlab's level runs a second time after vLLM's client on the same server, so that an order effect
(the first load on a freshly started server) shows as the gap between kvlab's two readings.

Usage: python benchmarks/load_bench.py [--clients 4] [--requests 16] [--output-tokens 32] [--budget-mib 30.9375]
                                      [--again]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile

from kvlab.core.experiment_spec import parse_spec
from kvlab.core.kv_config import BASELINE, KVCacheConfig
from kvlab.engines.host import offer
from kvlab.engines.launched import build
from kvlab.experiments.runner import build_items
from kvlab.models import DEFAULT_MODEL, resolve_model

#: vLLM's own client, run in vLLM's interpreter; its result's scalar figures on the last line, as JSON.
VLLM_CLIENT = ("import argparse, json, sys\n"
               "from vllm.benchmarks.serve import add_cli_args, main\n"
               "parser = argparse.ArgumentParser(); add_cli_args(parser)\n"
               "result = main(parser.parse_args(sys.argv[1:]))\n"
               "print(json.dumps({k: v for k, v in result.items() if isinstance(v, (int, float, str))}))\n")


def spec(args: argparse.Namespace) -> dict:
    return {"name": "load-bench", "model": DEFAULT_MODEL, "configs": [{"name": "baseline"}],
            # no prefix caching: kvlab's requests repeat the items' prompts in turn, vLLM's client sends random ones; a
            # cached prefix would make kvlab's repeats cheaper, and more so in a bigger pool (measured: fp8/baseline
            # 2.77x output tokens/s by kvlab's client against 1.38x by vLLM's with prefix caching on)
            "backend": {"kind": "vllm", "server": {"max_model_len": 1024, "startup_timeout_s": 1800,
                                                   "prefix_cache": False}},
            "tasks": [{"name": "passkey", "context_lengths": [512], "depths": [0.25, 0.75], "num_items": 4,
                       "max_new_tokens": 8}],
            "load": {"kv_budget_mib": args.budget_mib, "concurrency": [args.clients], "requests": args.requests,
                     "output_tokens": args.output_tokens}}


def vllm_client(python: str, root: str, model: str, input_len: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [python, "-c", VLLM_CLIENT, "--backend", "openai", "--base-url", root, "--endpoint", "/v1/completions",
                "--model", model, "--tokenizer", str(resolve_model(DEFAULT_MODEL)), "--dataset-name", "random",
                "--random-input-len", str(input_len), "--random-output-len", str(args.output_tokens),
                "--num-prompts", str(args.requests), "--max-concurrency", str(args.clients), "--ignore-eos",
                "--seed", "0", "--result-dir", tmp]
        ran = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
    if ran.returncode != 0:
        raise SystemExit(f"vllm.benchmarks.serve failed: {ran.stderr.strip().splitlines()[-1:]}")
    return json.loads(ran.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--budget-mib", type=float, default=30.9375)
    parser.add_argument("--again", action="store_true", help="kvlab's level again after vLLM's client")
    args = parser.parse_args()
    parsed = parse_spec(spec(args))
    assert parsed.load is not None
    here = offer("vllm")
    configs = [BASELINE] + [KVCacheConfig(quant=q) for q in ("fp8_e4m3",) if q in here.runs]
    for quant, why in here.refused.items():
        print(f"not here: {quant}: {why}")
    engine = build(parsed)
    items = build_items(parsed, engine.tokenizer)
    input_len = round(sum(len(engine.tokenizer(i.context + i.question)["input_ids"]) for i in items) / len(items))
    rows: dict[str, dict[str, dict]] = {}
    try:
        for config in configs:
            (kvlab_level,) = engine.measure_load(config, items, parsed.load, parsed.seed)
            assert engine.server_root is not None  # the server just measured, still up
            theirs = vllm_client(engine.server_python, engine.server_root, engine.served_name, input_len, args)
            if args.again:  # the same server (still up for this config), after vLLM's client
                (again,) = engine.measure_load(config, items, parsed.load, parsed.seed)
                print(f"{config.label}: kvlab's level after vLLM's: {again.output_throughput:.2f} out tok/s "
                      f"(first {kvlab_level.output_throughput:.2f}), TTFT mean {again.latency('ttft', 'mean'):.0f} ms, "
                      f"TPOT mean {again.latency('tpot', 'mean'):.1f} ms, at most {again.server.max_running} running, "
                      f"{again.server.preemptions} preempted")
            rows[config.label] = {
                "kvlab": {"out tok/s": kvlab_level.output_throughput, "req/s": kvlab_level.request_throughput,
                          "TTFT mean ms": kvlab_level.latency("ttft", "mean"),
                          "TTFT p99 ms": kvlab_level.latency("ttft", "p99"),
                          "TPOT mean ms": kvlab_level.latency("tpot", "mean"),
                          "max running": kvlab_level.server.max_running, "pool tokens": kvlab_level.pool_tokens},
                "vllm": {"out tok/s": theirs["output_throughput"], "req/s": theirs["request_throughput"],
                         "TTFT mean ms": theirs["mean_ttft_ms"], "TTFT p99 ms": theirs["p99_ttft_ms"],
                         "TPOT mean ms": theirs["mean_tpot_ms"]},
            }
    finally:
        engine.close()
    print(f"{args.clients} clients, {args.requests} requests of {args.output_tokens} output tokens, KV budget "
          f"{args.budget_mib} MiB each; kvlab: the items' prompts ({input_len} tokens on average), vLLM: random "
          f"prompts of {input_len} tokens")
    for label, row in rows.items():
        print(f"\n{label} (pool {row['kvlab']['pool tokens']:,} tokens, at most {row['kvlab']['max running']} "
              "running):")
        for metric, ours in row["kvlab"].items():
            if metric in row["vllm"]:
                theirs = row["vllm"][metric]
                print(f"  {metric:14} kvlab {ours:10.2f}   vllm bench serve {theirs:10.2f}   ratio {ours / theirs:.2f}")
    if len(rows) > 1:
        base, other = rows["baseline"], rows[configs[1].label]
        print(f"\n{configs[1].label} / baseline, read by each client:")
        for metric in ("out tok/s", "req/s", "TTFT mean ms", "TTFT p99 ms", "TPOT mean ms"):
            print(f"  {metric:14} kvlab {other['kvlab'][metric] / base['kvlab'][metric]:.2f}x   "
                  f"vllm bench serve {other['vllm'][metric] / base['vllm'][metric]:.2f}x")


if __name__ == "__main__":
    main()
