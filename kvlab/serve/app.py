"""The FastAPI app of ``kvlab serve``: OpenAI's request shapes, auth, health, metrics.

Every error is answered in OpenAI's shape (:mod:`kvlab.serve.errors`) and counted in
``/metrics`` under its status (:mod:`kvlab.serve.middleware`).  Generation runs on its own
thread, one request at a time, and stops when its client goes away or the server stops
(:mod:`kvlab.serve.engine_thread`, :mod:`kvlab.serve.connection`).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import AsyncIterator, Collection
from typing import Any, Literal, cast

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from kvlab.core.errors import ConfigError
from kvlab.core.kv_config import KVCacheConfig
from kvlab.engines.prompt_scoring import Sampling
from kvlab.serve.connection import ClientGone, EventStream, until_disconnected
from kvlab.serve.engine_thread import EngineLock, Generation
from kvlab.serve.errors import APIError, install_error_handlers, internal_error, shutting_down
from kvlab.serve.generation import Decoding, Delta, Finished, ServedModel, ServedPrompt
from kvlab.serve.logprobs import MAX_LOGPROBS
from kvlab.serve.middleware import CLIENT_CLOSED, OUTCOME, AllowHosts, CatchErrors, CountRequests, LimitBody
from kvlab.serve.playground import Playground, PlaygroundRequest, PlaygroundRun
from kvlab.serve.shapes import SSE_DONE, ChatShape, CompletionShape, sse

DEFAULT_CHAT_MAX_TOKENS = 256
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
ENDPOINTS = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize", "/kvlab/playground", "/health",
             "/metrics")


class StreamOptions(BaseModel):
    include_usage: bool = Field(default=False, description="End the stream with a chunk holding the token usage.")


#: Sampling fields of OpenAI's and vLLM's requests that kvlab serve does not apply: each is refused unless
#: absent or at a value that leaves the model's distribution as it is (vLLM's neutral values).
NEUTRAL_SAMPLING: dict[str, tuple[Any, ...]] = {
    "top_p": (1,), "top_k": (0, -1), "min_p": (0,), "typical_p": (1,), "frequency_penalty": (0,),
    "presence_penalty": (0,), "repetition_penalty": (1,), "logit_bias": ({},), "best_of": (1,),
    "use_beam_search": (False,), "min_tokens": (0,), "ignore_eos": (False,), "stop_token_ids": ([],),
    "bad_words": ([],), "allowed_token_ids": (), "logprob_token_ids": (), "suffix": ("",),
    "top_logprobs": (0,), "response_format": (), "structured_outputs": (), "guided_json": (), "guided_regex": (),
    "guided_choice": (), "guided_grammar": (),
}
#: The seeds vLLM takes (signed 64-bit).
SEED_RANGE = (-2**63, 2**63 - 1)


class _Request(BaseModel):
    """Fields shared by both endpoints.  Unknown fields are accepted and ignored (as vLLM does);
    the ones whose non-default values kvlab cannot honour are refused in :meth:`check`."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(description="The served model's name (`/v1/models`).")
    max_tokens: int | None = Field(default=None, ge=1, description=f"New tokens at most; unset: 16 for a completion, "
                                   f"{DEFAULT_CHAT_MAX_TOKENS} for a chat.")
    # kvlab's default (None) is greedy, so that results repeat; vLLM's is 1.0 (or the model's generation config)
    temperature: float | None = Field(default=None, description="In [0, 2]; unset or 0: greedy (results repeat); "
                                      "above 0: samples the model's own distribution.")
    seed: int | None = Field(default=None, description="Seeds sampling: the same seed, the same tokens.")
    n: int = Field(default=1, description="Choices per request: 1 only.")
    stop: str | list[str] | None = Field(default=None, description="Up to 4 stop strings.")
    stream: bool = Field(default=False, description="Answer as server-sent events.")
    stream_options: StreamOptions | None = Field(default=None, description="OpenAI's stream options.")
    return_token_ids: bool | None = Field(
        default=None, description="vLLM's: the prompt's and the generated tokens' ids (prompt_token_ids, token_ids).")
    prompt_logprobs: int | None = Field(
        default=None, description="vLLM's: each prompt token's log-probability with the top N tokens per position "
        f"(0 to {MAX_LOGPROBS}; vLLM's -1, the whole vocabulary, is refused); not with stream.")
    kv_cache: dict[str, Any] | None = Field(
        default=None, description="kvlab's: this request's KV-cache config (a [[configs]] entry's fields); unset: "
        "the server's default config.")
    kv_cache_positions: bool = Field(
        default=False, description="kvlab's: also report which prompt positions each KV head of each layer kept "
        "(kept_positions, a token map).")

    def check(self, vocab_size: int) -> None:
        if self.n != 1:
            raise APIError(400, "kvlab serve returns one choice per request (n = 1)", param="n")
        temperature = self.temperature
        if temperature is not None and not (math.isfinite(temperature) and 0 <= temperature <= 2):
            raise APIError(400, f"temperature must be in [0, 2] (0: greedy), got {temperature}", param="temperature")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise APIError(400, f"seed must be a signed 64-bit integer, got {self.seed}", param="seed")
        fields = self.model_dump(exclude_unset=True) | (self.model_extra or {})
        for name, neutral in NEUTRAL_SAMPLING.items():
            if fields.get(name) is not None and fields[name] not in neutral:
                leave = f"leave it unset or {neutral[0]!r}" if neutral else "leave it unset"
                raise APIError(400, f"{name} = {fields[name]!r} is not supported: kvlab serve decodes greedily or "
                               f"samples from the model's own distribution (temperature and seed only); {leave}",
                               param=name)
        if fields.get("echo") or fields.get("logprobs"):
            name = "echo" if fields.get("echo") else "logprobs"
            raise APIError(400, f"{name}: kvlab serve does not return the generated tokens' log-probabilities "
                           "(echo / logprobs); send the tokens to score as the prompt, with prompt_logprobs",
                           param=name)
        self._check_prompt_logprobs(vocab_size)
        if len(self.stops) > 4:
            raise APIError(400, "at most 4 stop sequences", param="stop")

    def _check_prompt_logprobs(self, vocab_size: int) -> None:
        """vLLM's rules and limit (``CompletionRequest.check_logprobs``, ``SamplingParams._validate_logprobs``)."""
        asked = self.prompt_logprobs
        if asked is None:
            return
        if asked == -1:  # vLLM's "the whole vocabulary", refused by vLLM too unless its --max-logprobs is -1
            raise APIError(400, f"prompt_logprobs = -1 asks for the whole vocabulary ({vocab_size:,} tokens) at every "
                           f"prompt position; at most {MAX_LOGPROBS} top tokens per position are returned: ask for 0 "
                           f"to {MAX_LOGPROBS}", param="prompt_logprobs")
        if asked < 0:
            raise APIError(400, f"prompt_logprobs must be 0 to {MAX_LOGPROBS} (the top tokens returned beside each "
                           f"prompt token), got {asked}", param="prompt_logprobs")
        if self.stream and asked != 0:
            raise APIError(400, "prompt_logprobs are not available when stream=True", param="prompt_logprobs")
        if asked > MAX_LOGPROBS:
            raise APIError(400, f"Requested prompt logprobs of {asked}, which is greater than max allowed: "
                           f"{MAX_LOGPROBS}", param="prompt_logprobs")

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature or 0.0, self.seed)

    @property
    def scored(self) -> int | None:
        """The top tokens per prompt position to return (None: no prompt scores; a stream has none)."""
        return None if self.prompt_logprobs is None or self.stream else self.prompt_logprobs

    @property
    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] = Field(description="The prompt: text, or token ids.")
    echo: bool = Field(default=False, description="Refused when true: send the tokens to score as the prompt, with "
                       "prompt_logprobs.")
    logprobs: int | None = Field(default=None, description="Refused when set (the generated tokens' "
                                 "log-probabilities are not returned).")
    # Without kv_cache_question_chars a server cannot tell the question, and the last prompt token plays it.
    kv_cache_question_chars: int | None = Field(
        default=None, ge=0, description="kvlab's: the prompt's last N characters are the question, tokenized on "
        "their own and laid out as the embedded engine does (compressed before it is seen, or never evicted when "
        "query-aware); unset or 0: the last prompt token plays the question.")
    kv_cache_prompt_split: list[int] | None = Field(
        default=None, description="kvlab's: [context tokens, question tokens] of a token prompt (as a sampled "
        "answer's kv_cache_prompt_split gives them); the tokens after them are teacher-forced through the cache the "
        "config leaves (a continuation to score with prompt_logprobs).")


class TokenizeRequest(BaseModel):
    """vLLM's ``/tokenize`` body (a text prompt); ``return_offsets`` is kvlab's: each token's character span."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(description="The served model's name.")
    prompt: str = Field(description="The text to tokenize.")
    add_special_tokens: bool = Field(default=True, description="As the completions endpoint adds them.")
    return_token_strs: bool = Field(default=False, description="Also return each token as a string.")
    return_offsets: bool = Field(default=False, description="kvlab's: each token's [start, end) character span in "
                                 "the prompt.")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "developer", "tool"] = Field(description="Who speaks.")
    content: str | list[dict[str, Any]] | None = Field(default=None, description="Text, or OpenAI's content "
                                                       "parts.")


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation, laid out by the model's "
                                        "chat template.")


def create_app(served: ServedModel, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, allowed_hosts: Collection[str] | None = None) -> FastAPI:
    """The app; ``api_key`` (from the environment or secrets, never a command line) turns auth on
    for ``/v1/*``.  ``/health`` and ``/metrics`` stay open, as on vLLM.  Request bodies over
    ``max_body_bytes`` are refused with a 413 before they are read.  ``allowed_hosts``: the only
    ``Host`` names answered (None: any; ``kvlab serve`` without a key passes its address's names)."""
    app = FastAPI(title="kvlab serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.served = served
    lock = EngineLock(served)
    playground = Playground(served)
    install_error_handlers(app)
    app.add_middleware(LimitBody, max_bytes=max_body_bytes)
    if allowed_hosts is not None:
        app.add_middleware(AllowHosts, hosts=allowed_hosts)
    app.add_middleware(CatchErrors)
    app.add_middleware(CountRequests, metrics=served.metrics, endpoints=ENDPOINTS)  # the outermost

    async def authorize(request: Request) -> None:
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
    async def health() -> Response:
        """200 once the model is loaded (no auth, as on vLLM)."""
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        """Prometheus text: kvlab:kv_cache_bytes, kvlab:requests_total (by endpoint and status),
        kvlab:time_to_first_token_seconds, tokens, queue (no auth)."""
        return PlainTextResponse(served.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models() -> dict[str, Any]:
        """The served model, its max_model_len, and (kvlab's) its default KV-cache config and engine."""
        return {"object": "list", "data": [{
            "id": served.name, "object": "model", "created": int(time.time()), "owned_by": "kvlab",
            "max_model_len": served.max_model_len,
            "kvlab": {"kv_cache": served.default_config.model_dump(mode="json"), "per_request_kv_cache": True,
                      "engine": served.engine.describe()},
        }]}

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        """OpenAI's completions, streaming or not; every answer carries a kv_cache block with the measured bytes."""
        config = _check(served, body)
        prompt = await run_in_threadpool(_completion_prompt, served, body)
        return await _respond(served, lock, request, body, config, prompt, CompletionShape)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        """OpenAI's chat completions (a model with a chat template), streaming or not, with the kv_cache block."""
        config = _check(served, body)
        if not served.has_chat_template:
            raise APIError(400, f"{served.name} has no chat template (a base model): use /v1/completions")
        prompt = await run_in_threadpool(_chat_prompt, served, body)
        return await _respond(served, lock, request, body, config, prompt, ChatShape)

    @app.post("/kvlab/playground", dependencies=[Depends(authorize)])
    async def playground_run(body: PlaygroundRequest, request: Request) -> Response:
        """kvlab's: one item under several configs at once (:mod:`kvlab.serve.playground`), in its turn; streamed
        with its progress on request (``stream``); a client gone stops its run."""
        _check_unicode(body.model_dump(), "")
        run = PlaygroundRun(playground, lock, await run_in_threadpool(playground.prepare, body))
        if body.stream:
            return EventStream(_playground_events(request, run), run, served.stopping)
        try:
            return JSONResponse(await until_disconnected(request, _playground_answer(run)))
        except ClientGone:
            setattr(request.state, OUTCOME, CLIENT_CLOSED)
            return Response(status_code=CLIENT_CLOSED)  # sent to nobody
        finally:
            run.cancel()

    @app.post("/tokenize", dependencies=[Depends(authorize)])
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        """vLLM's ``/tokenize``: the prompt's token ids as the completions endpoint reads them (``add_special_tokens``
        as there), the token strings on request, and (kvlab's) each token's ``[start, end)`` in the prompt."""
        _check_unicode(body.model_dump(), "")
        if body.model != served.name:
            raise APIError(404, f"The model `{body.model}` does not exist. This server serves `{served.name}`.",
                           type_="NotFoundError", param="model", code="model_not_found")
        _check_length(served, body.prompt)
        return await run_in_threadpool(_tokenized, served, body)

    return app


def _tokenized(served: ServedModel, body: TokenizeRequest) -> dict[str, Any]:
    encoded = served.tokenizer(body.prompt, add_special_tokens=body.add_special_tokens,
                               return_offsets_mapping=body.return_offsets)
    ids = encoded["input_ids"]
    answer: dict[str, Any] = {"count": len(ids), "max_model_len": served.max_model_len, "tokens": ids,
                              "token_strs": served.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs
                              else None}
    if body.return_offsets:
        answer["offsets"] = [list(span) for span in encoded["offset_mapping"]]
    return answer


def _check(served: ServedModel, body: _Request) -> KVCacheConfig:
    """What can be refused before the prompt is tokenized; returns the request's KV config."""
    _check_unicode(body.model_dump(), "")
    body.check(served.vocab_size)
    if body.model != served.name:
        raise APIError(404, f"The model `{body.model}` does not exist. This server serves `{served.name}`.",
                       type_="NotFoundError", param="model", code="model_not_found")
    return _config(served, body)


def _check_unicode(value: Any, where: str) -> None:
    """JSON's ``\\ud800`` escapes decode to lone surrogates, which are no text: no tokenizer takes them,
    and no answer that echoed them could be encoded.  Refused wherever they are (keys too), naming the field."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            field = where or "body"
            raise APIError(400, f"{field}: a lone surrogate (\\u{ord(value[error.start]):04x}) at character "
                           f"{error.start} is not text; send valid Unicode", param=field) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(key, where)
            _check_unicode(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_unicode(item, f"{where}.{index}")


def _completion_prompt(served: ServedModel, body: CompletionRequest) -> ServedPrompt:
    prompt = body.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if body.kv_cache_prompt_split is not None and body.kv_cache_question_chars:
        raise APIError(400, "kv_cache_prompt_split and kv_cache_question_chars both say where the question is: "
                       "send one", param="kv_cache_prompt_split")
    if isinstance(prompt, str):
        _check_length(served, prompt)
        if body.kv_cache_question_chars and body.kv_cache_question_chars >= len(prompt):
            raise APIError(400, "kv_cache_question_chars must be shorter than the prompt",
                           param="kv_cache_question_chars")
        if body.kv_cache_prompt_split is None:
            return ServedPrompt(*served.encode(prompt, body.kv_cache_question_chars))
        ids = served.tokenizer(prompt)["input_ids"]
    elif all(isinstance(t, int) for t in prompt):
        if body.kv_cache_question_chars:
            raise APIError(400, "kv_cache_question_chars needs a text prompt", param="kv_cache_question_chars")
        ids = cast(list[int], prompt)  # every one an int (all() above does not narrow the list)
        if ids and not 0 <= min(ids) <= max(ids) < served.vocab_size:
            bad = next(t for t in ids if not 0 <= t < served.vocab_size)
            raise APIError(400, f"prompt: token id {bad} is outside the vocabulary (0 to {served.vocab_size - 1})",
                           param="prompt", code="invalid_token_id")
    else:
        raise APIError(400, "one prompt per request", param="prompt")
    return _split(ids, body.kv_cache_prompt_split)


def _split(ids: list[int], split: list[int] | None) -> ServedPrompt:
    """The prompt laid out by ``kv_cache_prompt_split`` (``[context, question]`` tokens, the rest teacher-forced);
    without it, all but the last token are the context."""
    if split is None:
        return ServedPrompt(ids[:-1], ids[-1:])
    if len(split) != 2 or split[0] < 0 or split[1] < 1 or sum(split) > len(ids):
        raise APIError(400, f"kv_cache_prompt_split must be [context tokens, question tokens]: two counts, the "
                       f"question's at least 1, together at most the prompt's {len(ids)} tokens; got {split}",
                       param="kv_cache_prompt_split")
    context, question = split
    return ServedPrompt(ids[:context], ids[context:context + question], ids[context + question:])


def _chat_prompt(served: ServedModel, body: ChatRequest) -> ServedPrompt:
    messages = []
    for index, message in enumerate(body.messages):
        fields = message.model_dump(exclude_none=True)
        if isinstance(message.content, list):  # OpenAI's content parts: only text ones here
            if not all(part.get("type") == "text" and isinstance(part.get("text"), str) for part in message.content):
                raise APIError(400, f"messages.{index}.content: kvlab serve takes text only "
                               "(parts of type 'text' with a 'text' string)", param=f"messages.{index}.content")
            fields["content"] = "".join(part["text"] for part in message.content)
        messages.append(fields)
    try:
        text = served.chat_prompt(messages)
    except Exception as error:  # the model's template, run on the client's messages: its complaint is theirs
        raise APIError(400, f"messages: {served.name}'s chat template refused them: {error}",
                       param="messages") from None
    _check_length(served, text)
    return ServedPrompt(*served.encode(text, special=False))  # the template has the special tokens


def _check_length(served: ServedModel, text: str) -> None:
    if served.max_prompt_chars and len(text) > served.max_prompt_chars:
        raise APIError(400, f"this model's maximum context length is {served.max_model_len} tokens; a prompt of "
                       f"{len(text):,} characters is longer than that many tokens can be", param="prompt")


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


async def _respond(served: ServedModel, lock: EngineLock, request: Request, body: _Request, config: KVCacheConfig,
                   prompt: ServedPrompt, shape_type: type[CompletionShape]) -> Response:
    max_tokens = body.max_tokens or (DEFAULT_CHAT_MAX_TOKENS if shape_type is ChatShape else 16)
    if served.max_model_len and len(prompt) + max_tokens > served.max_model_len:
        raise APIError(400, f"this model's maximum context length is {served.max_model_len} tokens; the prompt has "
                       f"{len(prompt)} and max_tokens is {max_tokens}", param="max_tokens")
    if not prompt.question:
        raise APIError(400, "the prompt is empty", param="prompt")
    decoding = Decoding(max_tokens, body.stops, body.sampling, body.scored, body.kv_cache_positions)
    generation = Generation(served, lock, prompt, config, decoding)
    shape = shape_type(served.name, prompt.ids if body.return_token_ids else None)
    streaming = False
    try:
        if not await until_disconnected(request, generation.start()):
            raise shutting_down()
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            response = EventStream(_sse(request, generation, shape, include_usage), generation, served.stopping)
            streaming = True
            return response
        return JSONResponse(shape.full(*await until_disconnected(request, _collect(generation))))
    except ClientGone:
        setattr(request.state, OUTCOME, CLIENT_CLOSED)
        return Response(status_code=CLIENT_CLOSED)  # sent to nobody
    finally:
        if not streaming:
            generation.cancel()


async def _collect(generation: Generation) -> tuple[str, Finished]:
    text = ""
    while (event := await generation.next()) is not None:
        if isinstance(event, Delta):
            text += event.text
        elif isinstance(event, Finished):
            return text, event
    raise shutting_down()


async def _sse(request: Request, generation: Generation, shape: CompletionShape,
               include_usage: bool) -> AsyncIterator[str]:
    """The stream's events; an error after the first one is sent as an error event (OpenAI's
    shape, which the ``openai`` client raises) and recorded as the request's outcome."""
    first, sent_ids = True, 0
    try:
        while (event := await generation.next()) is not None:
            if isinstance(event, Delta):
                yield sse(shape.chunk(event.text, None, first, event.token_ids))
                first, sent_ids = False, sent_ids + len(event.token_ids)
            elif isinstance(event, Finished):  # with the tokens no text was sent for (an end token, a stop string's)
                yield sse(shape.last_chunk(event, first, event.token_ids[sent_ids:]))
                if include_usage:
                    yield sse(shape.usage_chunk(event))
                yield SSE_DONE
                return
        error = shutting_down()
    except Exception as exc:
        error = internal_error(f"{request.method} {request.url.path}", exc)
    setattr(request.state, OUTCOME, error.status)
    yield sse(error.body())
    yield SSE_DONE


#: Seconds between a streamed playground run's progress events (sent even when nothing moved: a client reading
#: them notices within this time that it was asked to stop, and closes the connection).
PROGRESS_EVERY_S = 0.25


async def _playground_answer(run: PlaygroundRun) -> dict[str, Any]:
    await run.start()
    await run.wait()
    return run.answer()


async def _playground_events(request: Request, run: PlaygroundRun) -> AsyncIterator[str]:
    """A streamed playground run: its progress (queued, then the engine's phase and the configs answered) every
    :data:`PROGRESS_EVERY_S`, then its answer or an error event."""
    try:
        yield sse({"progress": run.progress.snapshot()})
        await run.start()
        while not await run.wait(PROGRESS_EVERY_S):
            yield sse({"progress": run.progress.snapshot()})
        yield sse({"answer": run.answer()})
        yield SSE_DONE
        return
    except APIError as refused:
        error = refused
    except Exception as exc:
        error = internal_error(f"{request.method} {request.url.path}", exc)
    setattr(request.state, OUTCOME, error.status)
    yield sse(error.body())
    yield SSE_DONE
