#!/usr/bin/env python3
"""Check kvlab's vLLM / SGLang plumbing on a GPU machine; every stage prints OK, SKIP or FAIL.

Run from a checkout (kvlab need not be installed; no internet is needed when the model is local):

    python scripts/gpu_check.py --model /models/Qwen2.5-0.5B-Instruct [--sweep] [--out DIR]

Stages: NVML facts (kvlab.experiments.telemetry.NvmlSource, sampled a few times); then for each of vllm and
sglang installed in this interpreter: start its server with an fp8_e4m3 KV cache
(server_command + ManagedServer), read the KV pool from its log, scrape /metrics once, send one
completion with the openai client, make one fidelity reference through the engine's own scoring
requests (one request pair: a continuation sampled at temperature 1, then scored as given tokens;
vLLM's prompt_logprobs, SGLang's native /generate), stop it; with --sweep, ``kvlab run`` a tiny vLLM spec
(baseline vs fp8_e4m3, or with --all-dtypes every vLLM cache dtype the GPU runs: TurboQuant, NVFP4 ...; passkey,
2 items at 1024 tokens); then the embedded engine's batched decode
on CUDA (--embedded-model, default smollm2-135m): one decode step for a batch of K configs against K
single steps, K = 1, 2, 4, 8, 16, at 2048 tokens.  Server logs and the sweep's files go to
--out (a new temporary directory by default).  Exit status: 1 if any stage failed, else 0.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # import kvlab from this checkout

SERVED_NAME = "kvlab-gpu-check"
KINDS = ("vllm", "sglang")
GIB = 1 << 30


class Report:
    """Stage results, printed as they come and again as a summary."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def add(self, stage: str, status: str, detail: str) -> None:
        print(f"[{status}] {stage}: {detail}", flush=True)
        self.rows.append((stage, status, detail))

    def run(self, stage: str, check: Callable[[], Any]) -> Any:
        """Run one stage; an exception becomes a FAIL line, never a traceback."""
        try:
            return check()
        except Exception as error:  # noqa: BLE001 -- the point of this script: report and carry on
            self.add(stage, "FAIL", f"{type(error).__name__}: {error}")
            return None

    def summary(self) -> int:
        print("\n=== summary ===")
        for stage, status, detail in self.rows:
            print(f"{status:4}  {stage:22} {' | '.join(detail.splitlines())[:110]}")
        failed = sum(status == "FAIL" for _, status, _ in self.rows)
        print(f"{len(self.rows)} stages, {failed} failed")
        return 1 if failed else 0


def check_environment(report: Report) -> None:
    facts = [f"python {sys.version.split()[0]} ({sys.executable})"]
    for package in KINDS:
        if importlib.util.find_spec(package) is None:
            facts.append(f"{package} not installed")
        else:
            try:
                facts.append(f"{package} {importlib.metadata.version(package)}")
            except importlib.metadata.PackageNotFoundError:  # importable from a source tree
                facts.append(f"{package} (version unknown)")
    import kvlab.core.experiment_spec  # noqa: F401 -- fails here, clearly, if kvlab's dependencies are missing

    report.add("environment", "OK", "; ".join(facts))


def check_nvml(report: Report, samples: int = 3) -> Any:
    """Sample the GPU a few times; returns the open NvmlSource (for readings with a server up) or None."""
    from kvlab.experiments.telemetry import NvmlSource

    try:
        source = NvmlSource()
    except Exception as error:  # noqa: BLE001 -- no pynvml, no driver, no device: all mean SKIP
        report.add("nvml", "SKIP", f"no NVIDIA GPU telemetry ({type(error).__name__}: {error})")
        return None
    name = source.nvml.nvmlDeviceGetName(source.handle)
    reading: dict[str, Any] = {}
    for index in range(samples):
        reading = source.read()
        print(f"  nvml sample {index + 1}: {reading}", flush=True)
        time.sleep(0.2)
    report.add("nvml", "OK", f"{name}: {reading['gpu_memory_used_bytes'] / GIB:.1f} of "
               f"{reading['gpu_memory_total_bytes'] / GIB:.1f} GiB used, {reading['gpu_utilization']}% busy, "
               f"{reading['gpu_power_w']:.0f} W, {reading['gpu_temperature_c']} C")
    return source


def check_server(report: Report, kind: str, args: argparse.Namespace, nvml: Any, out_dir: Path) -> None:
    if importlib.util.find_spec(kind) is None:
        report.add(kind, "SKIP", f"{kind} is not installed in {sys.executable}")
        return
    if not args.model:
        report.add(kind, "SKIP", "no --model PATH given")
        return
    import httpx
    import openai

    from kvlab.core.experiment_spec import ServerOptions
    from kvlab.core.kv_config import KVCacheConfig
    from kvlab.engines.launched import read_pool
    from kvlab.engines.managed_server import ManagedServer, ServerStartError, free_port
    from kvlab.engines.prometheus import parse_metrics, server_kv_snapshot
    from kvlab.engines.server_flags import health_path, server_command, server_env
    from kvlab.engines.servers.installs import Installed

    port = free_port()
    root = f"http://127.0.0.1:{port}"
    options = ServerOptions(python=sys.executable, memory_fraction=args.memory_fraction,
                            max_model_len=args.max_model_len)
    command = server_command(kind, args.model, KVCacheConfig(name="fp8_e4m3", quant="fp8_e4m3"), options,
                             port, SERVED_NAME, seed=0)
    print(f"$ {shlex.join(command)}", flush=True)
    env = server_env(kind, Installed(sys.executable), local_model=Path(args.model).exists())
    server = ManagedServer(command, root + health_path(kind), out_dir / f"{kind}.log", env=env,
                           startup_timeout_s=args.startup_timeout)
    started = time.monotonic()
    try:
        server.start()
        try:
            server.wait_healthy()
        except ServerStartError as error:
            report.add(f"{kind} start", "FAIL", str(error))
            return
        report.add(f"{kind} start", "OK", f"healthy after {time.monotonic() - started:.0f} s; log {server.log_path}")

        pool, where = read_pool(kind, root, server.log_text())  # /metrics (vLLM's cache_config_info), else the log
        if pool is None:
            report.add(f"{kind} kv pool", "FAIL", "no KV pool on /metrics or in the start-up log")
        else:
            size = "bytes unknown" if pool.bytes is None else (
                f"{pool.bytes / GIB:.2f} GiB, {pool.bytes_per_token:,.0f} B/token")
            report.add(f"{kind} kv pool", "OK", f"{pool.tokens:,} tokens, {size} <- {where}: {pool.source_line}")
        if nvml is not None:
            report.run(f"{kind} nvml", lambda: report.add(
                f"{kind} nvml", "OK", f"{nvml.read()['gpu_memory_used_bytes'] / GIB:.1f} GiB used with the server up"))

        def scrape() -> None:
            with httpx.Client(timeout=10.0, trust_env=False) as client:
                response = client.get(root + "/metrics")
            metrics = parse_metrics(response.text)
            if response.status_code != 200 or not metrics:
                report.add(f"{kind} metrics", "FAIL", f"HTTP {response.status_code}, {len(metrics)} samples")
                return
            snapshot = server_kv_snapshot(kind, metrics, pool)
            report.add(f"{kind} metrics", "OK", f"{len(metrics)} samples; {snapshot}")

        def complete() -> None:
            # The server runs without an API key; the client insists on one, so give a placeholder.
            with httpx.Client(trust_env=False) as http_client:
                client = openai.OpenAI(base_url=root + "/v1", api_key="no-key", timeout=120.0, max_retries=0,
                                       http_client=http_client)
                response = client.completions.create(model=SERVED_NAME, prompt="The capital of France is",
                                                     max_tokens=8, temperature=0.0)
            report.add(f"{kind} completion", "OK", f"{response.choices[0].text!r}; usage {response.usage}")

        def fidelity() -> None:
            # the sampled estimator's request pair as kvlab sends it to this engine (ServingEngine.scoring_api):
            # the baseline's reference of one item, sampled and then scored as given tokens on the same server
            from kvlab.core.items import TaskItem
            from kvlab.core.kv_config import BASELINE
            from kvlab.engines.server_fidelity import ServerScorer
            from kvlab.engines.servers import serving_engine

            engine = serving_engine(kind)
            item = TaskItem(task="gpu-check", item_id="gpu-check", context="The capital of France is Paris.",
                            question=" The capital of Italy is", answer="", context_length=0, depth=None,
                            max_new_tokens=8)
            with openai.OpenAI(base_url=root + "/v1", api_key="no-key", timeout=120.0, max_retries=0,
                               http_client=openai.DefaultHttpxClient(trust_env=False)) as client:
                scorer = ServerScorer(client, lambda: SERVED_NAME, lambda *_: None, engine.plain_sampling,
                                      engine.scoring_api)
                reference = scorer.reference(item, BASELINE, seed=1)
            if not reference.tokens or len(reference.logprobs) != len(reference.tokens) or not all(
                    lp <= 0.0 for lp in reference.logprobs):
                report.add(f"{kind} fidelity", "FAIL", f"a reference kvlab cannot use: {reference}")
                return
            top1 = sum(a == b for a, b in zip(reference.tokens, reference.top1, strict=True))
            report.add(f"{kind} fidelity", "OK", f"{len(reference.tokens)} sampled tokens after "
                       f"{len(reference.prompt_ids)} prompt tokens scored, mean logprob "
                       f"{sum(reference.logprobs) / len(reference.logprobs):.3f}, {top1} of them the top-1; "
                       f"{scorer.estimator}")

        report.run(f"{kind} metrics", scrape)
        report.run(f"{kind} completion", complete)
        report.run(f"{kind} fidelity", fidelity)
    finally:
        server.stop()
        print(f"  {kind} server stopped (alive: {server.alive()})", flush=True)


def sweep_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The tiny spec: vLLM, baseline vs fp8_e4m3 (or every dtype it runs here), one passkey task of 2 items at
    1024 tokens."""
    server: dict[str, Any] = {"python": sys.executable, "memory_fraction": args.memory_fraction}
    if args.max_model_len is not None:
        server["max_model_len"] = args.max_model_len
    return {
        "name": "gpu-check-sweep", "model": args.model, "seed": 0,
        "backend": {"kind": "vllm", "server": server},
        "tasks": [{"name": "passkey", "context_lengths": [1024], "depths": [0.5], "num_items": 2,
                   "max_new_tokens": 16}],
        "configs": [{"name": "baseline"}, *({"name": quant, "quant": quant} for quant in sweep_dtypes(args))],
    }


def sweep_dtypes(args: argparse.Namespace) -> list[str]:
    """fp8_e4m3; with ``--all-dtypes`` every vLLM cache dtype this interpreter's vLLM runs on this GPU, as kvlab
    reads it from the install's sources (``kvlab engines``: TurboQuant, NVFP4, per-token-head ...)."""
    if not args.all_dtypes:
        return ["fp8_e4m3"]
    from kvlab.engines.host import offer

    return [quant for quant in offer("vllm", sys.executable).runs if quant != "none"]


def check_sweep(report: Report, args: argparse.Namespace, out_dir: Path) -> None:
    if importlib.util.find_spec("vllm") is None:
        report.add("sweep", "SKIP", f"vllm is not installed in {sys.executable}")
        return
    if not args.model:
        report.add("sweep", "SKIP", "no --model PATH given")
        return
    import os

    import tomli_w

    spec_path = out_dir / "sweep.toml"
    spec_path.write_text(tomli_w.dumps(sweep_spec(args)))
    result_path = out_dir / "sweep.json"
    command = [sys.executable, "-m", "kvlab.cli", "run", str(spec_path), "--json", str(result_path), "--quiet"]
    print(f"$ {shlex.join(command)}", flush=True)
    env = {**os.environ,  # the servers kvlab launches get their own environment (server_flags.server_env)
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=args.sweep_timeout)
    except subprocess.TimeoutExpired:
        report.add("sweep", "FAIL", f"kvlab run did not finish in {args.sweep_timeout:g} s")
        return
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
    if done.returncode != 0 or not result_path.exists():
        report.add("sweep", "FAIL", f"kvlab run exited with {done.returncode}:\n{tail}")
    else:
        report.add("sweep", "OK", f"results in {result_path}:\n{tail}")


def check_batched_decode(report: Report, args: argparse.Namespace) -> None:
    import torch

    if not torch.cuda.is_available():
        report.add("batched decode", "SKIP", "no CUDA device visible to torch")
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from batch_timing import decode_step_timings

    from kvlab.engines.embedded import EmbeddedEngine
    from kvlab.models import load_model

    engine = EmbeddedEngine(load_model(args.embedded_model, device="cuda"))
    timings = decode_step_timings(engine, 2048)
    report.add("batched decode", "OK", f"{args.embedded_model} on {torch.cuda.get_device_name()}, 2048 tokens, "
               "one step for K int4 caches batched / K single steps: " + ", ".join(
                   f"K={t.members} {t.batched_s * 1000:.1f}/{t.singles_s * 1000:.1f} ms ({t.ratio:.2f})"
                   for t in timings))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="local model directory (or hub id, with internet) to serve")
    parser.add_argument("--sweep", action="store_true", help="also `kvlab run` a tiny vLLM spec")
    parser.add_argument("--all-dtypes", action="store_true",
                        help="the sweep runs every vLLM cache dtype this GPU runs (kvlab engines), not fp8_e4m3 alone")
    parser.add_argument("--out", type=Path, help="directory for server logs and sweep files (default: a temp dir)")
    parser.add_argument("--memory-fraction", type=float, default=0.5,
                        help="--gpu-memory-utilization / --mem-fraction-static (default 0.5)")
    parser.add_argument("--max-model-len", type=int, default=4096, help="--max-model-len / --context-length")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds a server may take to start")
    parser.add_argument("--embedded-model", default="smollm2-135m",
                        help="model for the embedded engine's batched-decode timing (default smollm2-135m)")
    parser.add_argument("--sweep-timeout", type=float, default=1200.0, help="seconds the sweep may take")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report()
    nvml = None
    try:
        out_dir = args.out or Path(tempfile.mkdtemp(prefix="kvlab-gpu-check-"))
        out_dir.mkdir(parents=True, exist_ok=True)
        print(f"output directory: {out_dir}", flush=True)
        report.run("environment", lambda: check_environment(report))
        nvml = report.run("nvml", lambda: check_nvml(report))
        for kind in KINDS:
            report.run(kind, lambda kind=kind: check_server(report, kind, args, nvml, out_dir))
        if args.sweep:
            report.run("sweep", lambda: check_sweep(report, args, out_dir))
        else:
            report.add("sweep", "SKIP", "--sweep not given")
        report.run("batched decode", lambda: check_batched_decode(report, args))
    except KeyboardInterrupt:
        report.add("interrupted", "FAIL", "stopped by the user")
    finally:
        if nvml is not None:
            report.run("nvml close", nvml.close)
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
