"""Stand-ins for the vLLM and SGLang servers, which need a CUDA GPU this machine does not have.

They take the real command lines kvlab builds (the flags the real engines define), print the
real engines' start-up KV-pool log lines (formats cited in kvlab/engines/server_logs.py) and
serve the OpenAI API with ``kvlab serve``'s app, storing the KV cache in the dtype asked for.
Only the GPU engine underneath is replaced; the interface kvlab drives is the same.
"""

from __future__ import annotations

import argparse
import os
import sys

GIB = 1024**3
POOL_TOKENS = 100_000  # what a small GPU slice would hold
QUANT = {"auto": "none", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def healthy() -> dict:
    return {}


def main(kind: str) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--model" if kind == "vllm" else "--model-path", dest="model")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=sorted(QUANT))
    parser.add_argument("--served-model-name")
    parser.add_argument("--seed" if kind == "vllm" else "--random-seed", dest="seed", type=int)
    parser.add_argument("--gpu-memory-utilization" if kind == "vllm" else "--mem-fraction-static", type=float)
    parser.add_argument("--max-model-len" if kind == "vllm" else "--context-length", type=int)
    parser.add_argument("--no-enable-prefix-caching" if kind == "vllm" else "--disable-radix-cache",
                        action="store_true")
    if kind == "sglang":
        parser.add_argument("--enable-metrics", action="store_true")
    args = parser.parse_args()
    if os.environ.get("KVLAB_STAND_IN_FAIL"):
        print(f"ValueError: {os.environ['KVLAB_STAND_IN_FAIL']}", flush=True)
        sys.exit(1)

    import torch
    import uvicorn

    from kvlab.core.kv_config import KVCacheConfig
    from kvlab.engines.embedded import EmbeddedEngine
    from kvlab.models import load_model
    from kvlab.serve import ServedModel, create_app

    torch.set_num_threads(1)
    engine = EmbeddedEngine(load_model(args.model))
    bits = 16 if args.kv_cache_dtype == "auto" else 8
    per_token = 2 * engine.loaded.num_layers * engine.loaded.num_kv_heads * engine.loaded.head_dim * bits // 8
    pool = POOL_TOKENS * per_token
    if kind == "vllm":  # vllm/v1/worker/gpu_worker.py, vllm/v1/core/kv_cache_utils.py
        print(f"(EngineCore_DP0 pid={os.getpid()}) INFO 11-30 05:00:00 [gpu_worker.py:298] "
              f"Available KV cache memory: {pool / GIB:.2f} GiB", flush=True)
        print(f"(EngineCore_DP0 pid={os.getpid()}) INFO 11-30 05:00:00 [kv_cache_utils.py:1087] "
              f"GPU KV cache size: {POOL_TOKENS:,} tokens", flush=True)
    else:  # python/sglang/srt/mem_cache/memory_pool.py
        print(f"[2026-11-30 05:00:00 TP0] KV Cache is allocated. #tokens: {POOL_TOKENS}, "
              f"K size: {pool / 2 / GIB:.2f} GB, V size: {pool / 2 / GIB:.2f} GB", flush=True)
    served = ServedModel(engine, args.served_model_name or args.model,
                         KVCacheConfig(quant=QUANT[args.kv_cache_dtype]))
    app = create_app(served)
    if kind == "sglang":
        app.add_api_route("/health_generate", healthy, methods=["GET"])
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
