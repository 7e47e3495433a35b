"""The FastAPI app of ``kvlab serve``: OpenAI's request and response shapes, auth, health, metrics."""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Iterator
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvlab.config import ConfigError, KVCacheConfig
from kvlab.serve.generation import Delta, Finished, ServedModel

DEFAULT_CHAT_MAX_TOKENS = 256


class APIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def response(self) -> JSONResponse:
        return JSONResponse(status_code=self.status, content={"error": {
            "message": self.message, "type": self.type, "param": self.param, "code": self.code}})


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Request(BaseModel):
    """Fields shared by both endpoints.  Unknown fields are accepted and ignored (as vLLM does);
    the ones whose non-default values kvlab cannot honour are refused in :meth:`check`."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    kv_cache: dict[str, Any] | None = None  # kvlab's extension: this request's KV-cache config

    def check(self) -> None:
        if self.n != 1:
            raise APIError(400, "kvlab serve returns one choice per request (n = 1)", param="n")
        if self.temperature not in (None, 0, 0.0):
            raise APIError(400, "kvlab serve decodes greedily so that results repeat: send temperature = 0",
                           param="temperature")
        if self.top_p not in (None, 1, 1.0):
            raise APIError(400, "kvlab serve decodes greedily: leave top_p unset or 1", param="top_p")
        if len(self.stops) > 4:
            raise APIError(400, "at most 4 stop sequences", param="stop")

    @property
    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str]
    echo: bool = False
    logprobs: int | None = None
    # kvlab's extension: the prompt's last N characters are the question, tokenized on their own and
    # laid out as the embedded backend does (compressed before it is seen, or never evicted when
    # query-aware).  Without it a server cannot tell, and the last prompt token plays the question.
    kv_cache_question_chars: int | None = Field(default=None, ge=1)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)


def create_app(served: ServedModel, api_key: str | None = None) -> FastAPI:
    """The app; ``api_key`` (from the environment or secrets, never a command line) turns auth on
    for ``/v1/*``.  ``/health`` and ``/metrics`` stay open, as on vLLM."""
    app = FastAPI(title="kvlab serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.served = served

    @app.exception_handler(APIError)
    async def _api_error(request: Request, error: APIError) -> JSONResponse:
        served.metrics.count(request.url.path, error.status)
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        served.metrics.count(request.url.path, 400)
        return APIError(400, f"{where}: {first.get('msg', 'invalid request')}", param=where or None).response()

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise APIError(401, "no API key: send the header 'Authorization: Bearer <key>'",
                           type_="authentication_error", code="missing_api_key")
        if not secrets.compare_digest(token.encode(), api_key.encode()):
            raise APIError(401, "Incorrect API key provided.", type_="authentication_error", code="invalid_api_key")

    @app.get("/health")
    def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(served.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    def models() -> dict[str, Any]:
        served.metrics.count("/v1/models", 200)
        return {"object": "list", "data": [{
            "id": served.name, "object": "model", "created": int(time.time()), "owned_by": "kvlab",
            "max_model_len": served.max_model_len,
            "kvlab": {"kv_cache": served.default_config.model_dump(mode="json"), "per_request_kv_cache": True,
                      "engine": served.engine.describe()},
        }]}

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    def completions(body: CompletionRequest) -> Response:
        prompt = _completion_prompt(served, body)
        return _respond(served, body, prompt, "/v1/completions", chat=False)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    def chat_completions(body: ChatRequest) -> Response:
        if not served.has_chat_template:
            raise APIError(400, f"{served.name} has no chat template (a base model): use /v1/completions")
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        prompt = served.encode(served.chat_prompt(messages), special=False)  # the template has the specials
        return _respond(served, body, prompt, "/v1/chat/completions", chat=True)

    return app


def _completion_prompt(served: ServedModel, body: CompletionRequest) -> tuple[list[int], list[int]]:
    if body.echo or body.logprobs:
        raise APIError(400, "kvlab serve does not return log-probabilities (echo / logprobs)", param="logprobs")
    prompt = body.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if body.kv_cache_question_chars and body.kv_cache_question_chars >= len(prompt):
            raise APIError(400, "kv_cache_question_chars must be shorter than the prompt",
                           param="kv_cache_question_chars")
        return served.encode(prompt, body.kv_cache_question_chars)
    if all(isinstance(t, int) for t in prompt):
        if body.kv_cache_question_chars:
            raise APIError(400, "kv_cache_question_chars needs a text prompt", param="kv_cache_question_chars")
        return list(prompt[:-1]), list(prompt[-1:])  # type: ignore[arg-type]
    raise APIError(400, "one prompt per request", param="prompt")


def _config(served: ServedModel, body: _Request) -> KVCacheConfig:
    if body.kv_cache is None:
        return served.default_config
    try:
        config = KVCacheConfig(**body.kv_cache)
        served.engine.check_configs([config])
    except ValidationError as error:
        first = error.errors()[0]
        raise APIError(400, f"kv_cache.{'.'.join(map(str, first['loc']))}: {first['msg']}", param="kv_cache") from None
    except ConfigError as error:
        raise APIError(400, f"kv_cache: {error}", param="kv_cache") from None
    return config


def _respond(served: ServedModel, body: _Request, prompt: tuple[list[int], list[int]], endpoint: str,
             chat: bool) -> Response:
    body.check()
    if body.model != served.name:
        raise APIError(404, f"The model `{body.model}` does not exist. This server serves `{served.name}`.",
                       type_="NotFoundError", param="model", code="model_not_found")
    config = _config(served, body)
    max_tokens = body.max_tokens or (DEFAULT_CHAT_MAX_TOKENS if chat else 16)
    length = len(prompt[0]) + len(prompt[1])
    if served.max_model_len and length + max_tokens > served.max_model_len:
        raise APIError(400, f"this model's maximum context length is {served.max_model_len} tokens; the prompt has "
                       f"{length} and max_tokens is {max_tokens}", param="max_tokens")
    if not prompt[1]:
        raise APIError(400, "the prompt is empty", param="prompt")
    events = served.generate(prompt, config, max_tokens, body.stops)
    shape = _ChatShape(served.name) if chat else _CompletionShape(served.name)
    served.metrics.count(endpoint, 200)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_sse(shape, events, include_usage), media_type="text/event-stream")
    text, finished = "", None
    for event in events:
        if isinstance(event, Delta):
            text += event.text
        else:
            finished = event
    assert finished is not None
    return JSONResponse(shape.full(text, finished))


def _usage(finished: Finished) -> dict[str, int]:
    return {"prompt_tokens": finished.prompt_tokens, "completion_tokens": finished.completion_tokens,
            "total_tokens": finished.prompt_tokens + finished.completion_tokens}


def _sse(shape: _CompletionShape, events: Iterator[Delta | Finished], include_usage: bool) -> Iterator[str]:
    first = True
    for event in events:
        if isinstance(event, Delta):
            yield _data(shape.chunk(event.text, None, first))
            first = False
        else:
            yield _data(shape.chunk("", event.finish_reason, first) | {"kv_cache": event.kv_cache})
            if include_usage:
                yield _data(shape.usage_chunk(_usage(event)))
    yield "data: [DONE]\n\n"


def _data(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


class _CompletionShape:
    object_full, object_chunk = "text_completion", "text_completion"

    def __init__(self, model: str):
        self.model, self.id, self.created = model, f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def choice(self, text: str, finish_reason: str | None, first: bool) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def chunk(self, text: str, finish_reason: str | None, first: bool) -> dict[str, Any]:
        return self._envelope(self.object_chunk) | {"choices": [self.choice(text, finish_reason, first)]}

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        return self._envelope(self.object_chunk) | {"choices": [], "usage": usage}

    def full(self, text: str, finished: Finished) -> dict[str, Any]:
        return self._envelope(self.object_full) | {
            "choices": [self.choice(text, finished.finish_reason, True)], "usage": _usage(finished),
            "kv_cache": finished.kv_cache}


class _ChatShape(_CompletionShape):
    object_full, object_chunk = "chat.completion", "chat.completion.chunk"

    def __init__(self, model: str):
        super().__init__(model)
        self.id = f"chatcmpl-{uuid.uuid4().hex}"

    def choice(self, text: str, finish_reason: str | None, first: bool) -> dict[str, Any]:
        delta: dict[str, Any] = {"content": text} | ({"role": "assistant"} if first else {})
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def full(self, text: str, finished: Finished) -> dict[str, Any]:
        return self._envelope(self.object_full) | {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finished.finish_reason}],
            "usage": _usage(finished), "kv_cache": finished.kv_cache}
