"""The playground on an OpenAI-compatible endpoint (a vLLM or SGLang server, any other): what such a server can
tell.  It decides its own KV cache, so the item runs once, as the server stores it: the answer marked right or
wrong, TTFT and TPOT as the streamed answer came, and the KV cache the request held as an estimate (prompt and
output tokens x the pool's bytes per token, from vLLM's ``/metrics``, else the model's geometry at the server's
cache dtype).  Which tokens a cache kept only the embedded engine can show (``kvlab serve``): there are no
token maps here.

A task's item is sized in the served model's tokens by the server's own ``/tokenize`` (vLLM's; ``kvlab
serve``'s), so the dashboard needs no tokenizer and stays free of torch.  Every fault is one
:class:`kvlab.dashboard.warm_engine.PlaygroundError` line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import httpx

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import BackendSpec
from kvlab.core.formats import FORMATS
from kvlab.core.geometry import CacheGeometry
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import BASELINE, KVCacheConfig
from kvlab.core.model_registry import KNOWN_MODELS
from kvlab.dashboard.page_keys import page_key
from kvlab.dashboard.warm_engine import PlaygroundError
from kvlab.engines.endpoint_rules import key_problem, sendable, server_root
from kvlab.engines.factory import openai_endpoint
from kvlab.engines.openai_compat import EndpointError, LaunchedKV, OpenAICompatEngine
from kvlab.engines.server_logs import KVPool
from kvlab.engines.servers import SERVERS
from kvlab.secrets import DEFAULT_KEY_VAR, Endpoint, redact
from kvlab.tasks.single import generated_item, own_item, score

#: Seconds a request to the endpoint may take (a long answer of a big model).
REQUEST_TIMEOUT_S = 300.0


class EndpointTokenizer:
    """The served model's tokenizer as kvlab's task generators call one, by the server's ``/tokenize``."""

    def __init__(self, endpoint: Endpoint):
        self._url = f"{server_root(endpoint.base_url)}/tokenize"
        self.model = endpoint.model_id  # the served model's id: set once the server has said it
        self._headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        self._client = httpx.Client(timeout=60.0, trust_env=False)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        try:
            response = self._client.post(self._url, headers=self._headers, json={
                "model": self.model, "prompt": text, "add_special_tokens": add_special_tokens})
        except httpx.HTTPError as error:
            raise PlaygroundError(f"{self._url} cannot be reached ({type(error).__name__})") from None
        try:
            tokens = response.json().get("tokens") if response.status_code == 200 else None
        except ValueError:  # not JSON: a server without vLLM's /tokenize
            tokens = None
        if not isinstance(tokens, list):
            raise PlaygroundError(f"{self._url} answered {response.status_code}: an item of a task is sized in the "
                                  "served model's tokens by the server's /tokenize (vLLM's); without it, give a "
                                  "JSONL row or your own text")
        return {"input_ids": tokens}

    def close(self) -> None:
        self._client.close()


def served_config(pool: KVPool | None) -> KVCacheConfig:
    """The config of the server's cache, as far as its pool says (the baseline when it does not)."""
    dtype = pool.cache_dtype if pool is not None else None
    said = {engine_dtype: name for server in SERVERS.values() for name, engine_dtype in server.kv_dtypes.items()}
    name = said.get(dtype) or next((f.name for f in FORMATS.values() if dtype in f.aliases), None) if dtype else None
    return KVCacheConfig(quant=name) if name else BASELINE


def pool_estimate(pool: KVPool | None, config: KVCacheConfig, model: str) -> LaunchedKV:
    """Bytes per token of the server's pool: as it states them, else from ``model``'s geometry (kvlab's
    registry) at the cache's bits; both unknown for a model kvlab does not know and a pool that is silent."""
    spec = KNOWN_MODELS.get(model)
    geometry = (CacheGeometry(spec.num_layers, spec.num_kv_heads, spec.head_dim) if spec and not spec.sliding_window
                else None)
    bits = FORMATS[config.quant].bits
    if pool is not None and pool.bytes_per_token is not None:
        stated = pool.bytes_per_token
        source = pool.source_line
    elif geometry is not None:
        stated = geometry.bytes_per_token(bits)
        source = f"{model}'s geometry: {geometry.formula(bits)}" + (f" ({pool.source_line})" if pool else "")
    else:
        return LaunchedKV(config, None, None, "the server states no pool bytes and kvlab lacks the model's geometry")
    baseline = geometry.bytes_per_token(16) if geometry is not None else stated * 16 / bits
    return LaunchedKV(config, stated, baseline, source)


def _pool(endpoint: Endpoint) -> KVPool | None:
    """The pool as the server's ``/metrics`` states it, read as each serving engine that states one there would
    (vLLM's ``cache_config_info``); None for a server that does not."""
    try:
        text = httpx.get(f"{server_root(endpoint.base_url)}/metrics", timeout=10.0, trust_env=False).text
    except httpx.HTTPError:
        return None
    return next((pool for server in SERVERS.values() if server.pool_on_metrics and (pool := server.stated_pool(text))),
                None)


def run_on_endpoint(item_fields: Mapping[str, Any], model: str, base_url: str | None, model_id: str | None,
                    max_new_tokens: int | None = None, typed_key: str = "") -> dict[str, Any]:
    """One run, in the shape of ``POST /kvlab/playground``'s answer (one result: the server's own cache, with
    ``kv_source`` saying where its bytes come from, ``kv_estimated`` whether they are an estimate (they are
    measured on ``kvlab serve``); no token spans, no kept positions).  The request carries ``typed_key``, else
    ``KVLAB_API_KEY`` only where it belongs (:func:`kvlab.dashboard.page_keys.page_key`): a link names the base
    URL, not where the dashboard's key goes."""
    try:
        endpoint = sent_key(openai_endpoint(base_url or None, model_id or None, DEFAULT_KEY_VAR), typed_key)
    except ConfigError as error:
        raise PlaygroundError(str(error)) from None
    backend = BackendSpec(kind="openai_compat", base_url=endpoint.base_url, max_retries=1,
                          request_timeout_s=REQUEST_TIMEOUT_S)
    pool = _pool(endpoint)
    config = served_config(pool)
    estimate = pool_estimate(pool, config, model)
    tokenizer = EndpointTokenizer(endpoint)
    engine = OpenAICompatEngine(endpoint, backend, tokenizer)
    try:
        engine.probe()
        if not engine.per_request_configs:  # kvlab serve measures what it held; any other server, estimated
            engine.launched = estimate
        tokenizer.model = engine.model_id
        item = _item(item_fields, tokenizer, max_new_tokens)
        result = next(engine.evaluate(item, [config]))
    except (EndpointError, ConfigError) as error:
        raise PlaygroundError(redact(str(error))) from None
    finally:
        engine.close()
        tokenizer.close()
    if result.error:
        raise PlaygroundError(f"{endpoint.base_url} refused the item: {result.error}")
    return {"item": {"task": item.task, "item_id": item.item_id, "context": item.context, "question": item.question,
                     "answer": item.answer},
            "context_offsets": None, "question_offsets": None, "endpoint": endpoint.base_url,
            "model_id": engine.model_id,
            "results": [{
                "config": f"{engine.model_id}'s cache ({config.label})", "settings": {},
                "generated": result.generated, "score": score(item, result.generated),
                "context_tokens": result.prompt_tokens, "kept_tokens": result.kv.kept_tokens,
                "kept_fraction": result.kept_fraction, "baseline_bytes": result.baseline_kv_bytes,
                "physical_bytes": result.physical_kv_bytes, "compression_ratio": result.compression_ratio,
                "ttft_s": result.ttft_s, "tpot_s": result.tpot_s, "mean_kl": None, "agreement": None,
                "query_aware": False, "kept_positions": None, "kv_source": result.kv.source,
                "kv_estimated": result.kv.estimated,
                "output_tokens": result.output_tokens}]}


def sent_key(endpoint: Endpoint, typed_key: str) -> Endpoint:
    """``endpoint`` with the key a page's request to it may carry (:func:`kvlab.dashboard.page_keys.page_key`)."""
    choice = page_key(DEFAULT_KEY_VAR, endpoint.base_url, typed_key)
    if choice.key and not sendable(choice.key):
        raise ConfigError(f"the typed API key {key_problem(choice.key)}: type the key exactly as issued")
    return replace(endpoint, api_key=choice.key,
                   key_source=f"none sent: {choice.withheld}" if choice.withheld else choice.source)


def _item(fields: Mapping[str, Any], tokenizer: EndpointTokenizer, max_new_tokens: int | None) -> TaskItem:
    """The view's item (:meth:`kvlab.dashboard.playground.PlaygroundView.item`): a task's, sized by the server."""
    if "task" not in fields:
        return own_item(fields["context"], fields["question"], fields.get("answer", ""),
                        **{key: fields[key] for key in ("scorer", "tolerance") if key in fields},
                        max_new_tokens=max_new_tokens)
    return generated_item(fields["task"], fields["context_length"], fields.get("depth"), fields["seed"], tokenizer,
                          max_new_tokens, fields.get("params"))
