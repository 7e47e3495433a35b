"""Stand-ins for the vLLM and SGLang servers, which need a CUDA GPU this machine does not have.

They take the real command lines kvlab builds (the flags the real engines define), print the
real engines' start-up KV-pool log lines (formats cited in kvlab/engines/server_logs.py) and
serve the OpenAI API with ``kvlab serve``'s app, storing the KV cache in the dtype asked for.
Only the GPU engine underneath is replaced; the interface kvlab drives is the same.

SGLang's stand-in also answers SGLang's native ``POST /generate`` (the shape
kvlab/engines/servers/sglang.py SGLangGenerate cites from SGLang's sources), from the same model
through kvlab serve's completions underneath, and ignores ``prompt_logprobs`` on its OpenAI
completions as SGLang does.  ``KVLAB_STAND_IN_NO_LOGPROBS=1``: its /generate answers hold no
log-probabilities (a build that does not answer ``return_logprob``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from typing import Any

GIB = 1024**3
POOL_TOKENS = 100_000  # what a small GPU slice would hold
QUANT = {"auto": "none", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def healthy() -> dict:
    return {}


class IgnorePromptLogprobs:
    """SGLang's OpenAI CompletionRequest (python/sglang/srt/entrypoints/openai/protocol.py) has no prompt_logprobs
    field, and pydantic drops unknown fields: the stand-in drops it from /v1/completions bodies too."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        try:
            payload = json.loads(body)
            payload.pop("prompt_logprobs", None)
            body = json.dumps(payload).encode()
        except (ValueError, AttributeError):
            pass  # not a JSON object: kvlab serve says so itself
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()  # the client going away, as kvlab serve listens for it
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        await self.app(dict(scope, headers=[*headers, (b"content-length", str(len(body)).encode())]), replay, send)


def add_generate(app: Any, served_name: str, logprobs: bool) -> None:
    """SGLang's ``POST /generate`` on ``app``: the sample or the greedy token from kvlab serve's completions, and
    (``return_logprob``) the log-probabilities of the prompt and output tokens from its ``prompt_logprobs`` over
    them, laid out as SGLang lays them out (input entries from ``logprob_start_len``, the first one's logprob None;
    ``[logprob, token_id, text]`` entries, text None; top lists best first)."""
    import httpx
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from kvlab.engines.endpoint_rules import error_message

    inner = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://stand-in", timeout=None)

    class Refused(Exception):
        def __init__(self, status: int, message: str):
            self.status, self.message = status, message

    async def complete(body: dict) -> dict:
        response = await inner.post("/v1/completions", json={"model": served_name, **body})
        answer = response.json()
        if response.status_code != 200:
            raise Refused(response.status_code, error_message(answer) or response.text)
        return answer["choices"][0]

    def entry(scored: list, ids: list[int], at: int) -> list:
        return [scored[at][str(ids[at])]["logprob"], ids[at], None]

    def top(scored: list, at: int, k: int) -> list:
        ranked = sorted((value["rank"], -value["logprob"], int(token)) for token, value in scored[at].items())
        return [[-minus, token, None] for rank, minus, token in ranked if rank <= k][:k]

    async def generate(request: Request) -> JSONResponse:
        body = await request.json()
        params = dict(body.get("sampling_params") or {})
        asked = params.pop("max_new_tokens", 128)  # SamplingParams' defaults: 128 tokens at temperature 1
        params["seed"] = params.pop("sampling_seed", None)
        params.setdefault("temperature", 1.0)
        prompt = body["input_ids"] if body.get("input_ids") is not None else body.get("text")
        try:
            choice = await complete({"prompt": prompt, "max_tokens": max(asked, 1), "return_token_ids": True,
                                     **params})
            prompt_ids, output_ids = choice["prompt_token_ids"], choice["token_ids"][:asked]
            meta: dict[str, Any] = {
                "id": uuid.uuid4().hex, "prompt_tokens": len(prompt_ids), "completion_tokens": len(output_ids),
                "cached_tokens": 0, "finish_reason": {"type": "length", "length": asked}
                if choice["finish_reason"] == "length" else {"type": "stop", "matched": output_ids[-1:]}}
            if logprobs and body.get("return_logprob"):
                start = body.get("logprob_start_len")
                start = len(prompt_ids) - 1 if start is None or start < 0 else start
                if start >= len(prompt_ids):
                    raise Refused(400, f"logprob_start_len {start} is not below the {len(prompt_ids)} input tokens")
                k, ids = body.get("top_logprobs_num") or 0, prompt_ids + output_ids
                scored = (await complete({"prompt": ids, "max_tokens": 1, "temperature": 0.0,
                                          "prompt_logprobs": max(k, 1)}))["prompt_logprobs"]
                meta["input_token_logprobs"] = [[None, ids[start], None]] + [
                    entry(scored, ids, at) for at in range(start + 1, len(prompt_ids))]
                meta["output_token_logprobs"] = [entry(scored, ids, at) for at in range(len(prompt_ids), len(ids))]
                if k > 0:
                    meta["input_top_logprobs"] = [None] + [top(scored, at, k)
                                                           for at in range(start + 1, len(prompt_ids))]
                    meta["output_top_logprobs"] = [top(scored, at, k) for at in range(len(prompt_ids), len(ids))]
        except Refused as refused:  # python/sglang/srt/entrypoints/http_server.py _create_error_response
            return JSONResponse({"error": {"message": refused.message}}, status_code=refused.status)
        return JSONResponse({"text": choice["text"] if asked else "", "output_ids": output_ids, "meta_info": meta})

    app.add_route("/generate", generate, methods=["POST", "PUT"])  # a plain route: the body is SGLang's, not kvlab's


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
    from kvlab.engines.embedded_streaming import StreamingEngine
    from kvlab.models import load_model
    from kvlab.serve import ServedModel, create_app

    torch.set_num_threads(1)
    engine = StreamingEngine(load_model(args.model))
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
    server: Any = app
    if kind == "sglang":
        app.add_api_route("/health_generate", healthy, methods=["GET"])
        add_generate(app, served.name, logprobs=not os.environ.get("KVLAB_STAND_IN_NO_LOGPROBS"))
        server = IgnorePromptLogprobs(app)
    uvicorn.run(server, host=args.host, port=args.port, log_level="warning")
