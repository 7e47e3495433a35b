"""llama-cpp-python's OpenAI-compatible server, with the two completion fields of vLLM that kvlab's sampled fidelity
estimator reads, computed from llama.cpp's own logits.

kvlab runs this file with the interpreter of the llama.cpp venv (``scripts/install_llamacpp.sh``), as a script: it
imports llama_cpp and its server's packages only, never kvlab.  Everything but the two fields is the package's own
server, unchanged (``llama_cpp.server.__main__.main``: the same flags, routes, locks and model), except that every
completion's body is checked before it reaches the package (:class:`KVLabFields`: a bad one is a 400 naming its
field, and never holds the model's locks).

Why not the package's ``echo`` + ``logprobs``: in llama-cpp-python 0.3.36 (``llama_cpp/llama.py``,
``Llama._create_completion``) an echoed prompt token's log-probability is read from its own position's logits, which
predict the *next* token (measured: after "The", " capital" is scored by the row whose top token is " of"), and every
position sorts the whole vocabulary in Python.  The fields added here, as vLLM 0.32 answers them:

- ``return_token_ids``: the choice carries ``prompt_token_ids`` and ``token_ids`` (sampled by the package's own
  ``Llama.generate`` with the request's sampling fields and seed);
- ``prompt_logprobs`` (k): the choice carries one entry per prompt token (None for the first; else
  ``{token id: {"logprob", "rank", "decoded_token"}}`` for the token given and the top k), from the logits of the
  position before it, in the cache this server holds (the prompt's prefix that is already cached is reused, as the
  package's generation reuses it);
- ``cache_salt`` (a string, as vLLM takes it), with one of those two: no cached prefix is reused; the prompt is
  evaluated afresh, in one pass of batches (kvlab's noise floor scores the baseline's sample so,
  :mod:`kvlab.analysis.noise_floor`).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from typing import Any

import llama_cpp
import llama_cpp.server.__main__ as server_main
import numpy as np
from llama_cpp.server import app as server_app
from llama_cpp.server.types import CreateCompletionRequest
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ROWS_PER_CHUNK = 64  # log-softmax this many positions at a time (a row is the whole vocabulary)
#: The most top log-probabilities a position may ask for: vLLM's default max_logprobs, which refuses more (every
#: prompt position carries that many entries, so an unbounded k is an unbounded answer)
MAX_TOP_LOGPROBS = 20
#: vLLM's ``prompt_logprobs = -1``: the whole vocabulary at every prompt position, which vLLM refuses too unless its
#: ``--max-logprobs`` is -1 (unbounded); refused here in the words ``kvlab serve`` uses (kvlab/serve/app.py)
WHOLE_VOCABULARY = -1
#: The seeds taken (vLLM's: a signed 64-bit integer), as kvlab serve takes them
SEED_RANGE = (-2**63, 2**63 - 1)
#: The longest cache_salt taken (vLLM 0.32 validate_cache_salt: at most 128 characters)
MAX_SALT = 128
#: The sampling fields :func:`_sample` reads as numbers: each a finite number, none negative
NON_NEGATIVE = ("temperature", "top_p", "min_p", "repeat_penalty")


class Refused(ValueError):
    """A request this server answers with a 400 naming its field (``param``), as the package answers a bad one."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _shown(value: Any) -> str:
    """A value as a refusal quotes it, cut short (a request's field may be megabytes)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise Refused(f"{name} must be an integer, got {_shown(value)}", name)
    if not low <= value <= high:
        raise Refused(f"{name} must be {low} to {high}, got {_shown(value)}", name)
    return value


def check_fields(body: dict[str, Any], vocabulary: int) -> None:
    """Refuse the fields this server's own answers read (:func:`_sample`, :func:`_score`) unless each is of its type
    and within its bounds: checked before the model's locks are taken, so a bad field never reaches llama.cpp."""
    asked = body.get("prompt_logprobs")
    if asked == WHOLE_VOCABULARY and not isinstance(asked, bool):
        raise Refused(f"prompt_logprobs = -1 asks for the whole vocabulary ({vocabulary:,} tokens) at every prompt "
                      f"position; at most {MAX_TOP_LOGPROBS} top tokens per position are returned: ask for 0 to "
                      f"{MAX_TOP_LOGPROBS}", "prompt_logprobs")
    _integer(body, "prompt_logprobs", 0, MAX_TOP_LOGPROBS)
    if body.get("return_token_ids") is not None and not isinstance(body["return_token_ids"], bool):
        raise Refused(f"return_token_ids must be true or false, got {_shown(body['return_token_ids'])}",
                      "return_token_ids")
    if body.get("stream") and body.get("prompt_logprobs") is not None:
        raise Refused("prompt_logprobs are not available when stream=True", "prompt_logprobs")
    for name in NON_NEGATIVE:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value < 0):
            raise Refused(f"{name} must be a finite number, 0 or more, got {_shown(value)}", name)
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not 1 <= len(salt) <= MAX_SALT):
        raise Refused(f"cache_salt must be a string of 1 to {MAX_SALT} characters, got {_shown(salt)}", "cache_salt")
    _integer(body, "top_k", -2**31, 2**31 - 1)
    _integer(body, "seed", *SEED_RANGE)
    _integer(body, "max_tokens", 0, 2**31 - 1)


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise Refused("the request's body must be a JSON object")
    return body


def _check_package_fields(body: dict[str, Any]) -> None:
    """The package's own model of a completion request (``llama_cpp/server/types.py`` CreateCompletionRequest) on
    every field but the prompt and vLLM's two: its route answers a field it cannot read with a 500 that holds a
    traceback, refused here with a 400 naming the field instead."""
    fields = {name: value for name, value in body.items()
              if name not in ("prompt", "prompt_logprobs", "return_token_ids", "cache_salt")}
    try:
        CreateCompletionRequest.model_validate(fields)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        raise Refused(f"{where}: {problem['msg']}", str(problem["loc"][0]) if problem["loc"] else None) from None


def prompt_ids(llama: llama_cpp.Llama, body: dict[str, Any]) -> list[int]:
    """The request's prompt as token ids (text tokenized as the package's completions do), refused unless each id is
    in the model's vocabulary and the prompt holds a token; tokenizing reads the vocabulary alone (no lock)."""
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return llama.tokenize(prompt.encode("utf-8", errors="replace"), special=True) if prompt else \
            [llama.token_bos()]
    if not isinstance(prompt, list) or not prompt or not all(type(t) is int for t in prompt):
        raise Refused("prompt must be text or a non-empty list of token ids", "prompt")
    vocabulary = llama.n_vocab()
    bad = next((t for t in prompt if not 0 <= t < vocabulary), None)
    if bad is not None:
        raise Refused(f"prompt: token id {_shown(bad)} is outside the vocabulary (0 to {vocabulary - 1})", "prompt")
    return list(prompt)


def check_length(llama: llama_cpp.Llama, ids: list[int], new_tokens: int) -> None:
    """Refuse a prompt whose tokens and ``new_tokens`` do not fit the context, in the package's own words
    (``Llama._create_completion``: "Requested tokens (N) exceed context window of M")."""
    if len(ids) + new_tokens > llama.n_ctx():
        raise Refused(f"Requested tokens ({len(ids) + new_tokens}) exceed context window of {llama.n_ctx()}"
                      + (f" ({len(ids)} in the prompt, {new_tokens} new)" if new_tokens else ""), "prompt")


def _sample(llama: llama_cpp.Llama, body: dict[str, Any], prompt_ids: list[int]) -> dict[str, Any]:
    """A sampled completion with its token ids (``return_token_ids``)."""
    if body.get("seed") is not None:
        llama.set_seed(int(body["seed"]))
    temperature = float(body.get("temperature", 1.0))
    _unless_salted(llama, body)
    tokens: list[int] = []
    finish = "length"
    for token in llama.generate(prompt_ids, top_k=int(body.get("top_k", 40)), top_p=float(body.get("top_p", 1.0)),
                                min_p=float(body.get("min_p", 0.05)), temp=temperature,
                                repeat_penalty=float(body.get("repeat_penalty", 1.0))):
        if llama_cpp.llama_vocab_is_eog(llama._model.vocab, token):
            finish = "stop"
            break
        tokens.append(token)
        if len(tokens) >= _new_tokens(body):
            break
    text = llama.detokenize(tokens, prev_tokens=prompt_ids).decode("utf-8", errors="ignore")
    return {"text": text, "index": 0, "finish_reason": finish, "logprobs": None, "prompt_token_ids": prompt_ids,
            "token_ids": tokens}


def _unless_salted(llama: llama_cpp.Llama, body: dict[str, Any]) -> None:
    """A request with a ``cache_salt`` reuses no cached prefix: the package's context is emptied first."""
    if body.get("cache_salt") is not None:
        llama.reset()


def _new_tokens(body: dict[str, Any]) -> int:
    """The new tokens a sampled answer may hold (unset or 0: 16, as vLLM's completions default)."""
    return int(body.get("max_tokens") or 16)


def _score(llama: llama_cpp.Llama, body: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    """Every prompt token's log-probability and the top ``prompt_logprobs`` at its position (vLLM's shape; 0: the
    prompt's own token alone)."""
    top = int(body["prompt_logprobs"])
    # One generation step evaluates what of the prompt is not cached yet (the package's own prefix reuse); with
    # logits_all, llama.scores then holds every position's logits.  A salt reuses nothing: the whole prompt afresh.
    _unless_salted(llama, body)
    next(iter(llama.generate(ids, temp=0.0)), None)
    entries: list[dict[str, dict[str, Any]] | None] = [None]
    for start in range(0, len(ids) - 1, ROWS_PER_CHUNK):
        rows = np.asarray(llama.scores[start:min(start + ROWS_PER_CHUNK, len(ids) - 1)], dtype=np.float64)
        rows -= rows.max(axis=1, keepdims=True)
        logprobs = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
        for offset, row in enumerate(logprobs):
            token = ids[start + offset + 1]
            best = np.argpartition(-row, top - 1)[:top] if 0 < top < row.size else np.arange(min(top, row.size))
            best = best[np.argsort(-row[best])]
            entry = {str(int(i)): {"logprob": float(row[i]), "rank": rank + 1,
                                   "decoded_token": llama.detokenize([int(i)]).decode("utf-8", errors="ignore")}
                     for rank, i in enumerate(best)}
            if str(token) not in entry:
                entry[str(token)] = {"logprob": float(row[token]), "rank": int((row > row[token]).sum()) + 1,
                                     "decoded_token": llama.detokenize([token]).decode("utf-8", errors="ignore")}
            entries.append(entry)
    return {"text": "", "index": 0, "finish_reason": "length", "logprobs": None, "prompt_logprobs": entries,
            "prompt_token_ids": ids}


def _ours(body: dict[str, Any]) -> bool:
    """Whether this middleware answers the completion (vLLM's fields) rather than the package."""
    return body.get("prompt_logprobs") is not None or body.get("return_token_ids") not in (None, False)


class KVLabFields:
    """ASGI middleware: a ``POST /v1/completions`` that asks for ``prompt_logprobs`` or ``return_token_ids`` is
    answered here, under the package's own model locks; every other request goes to the package's server.

    A request it refuses never wedges the server: its fields are checked before the locks are taken
    (:func:`check_fields`, :func:`prompt_ids`, :func:`check_length`), and the locks are taken as the package's own
    routes take them (``asynccontextmanager(get_llama_proxy)``), so that they are released in the task that took
    them whatever is raised.  (Iterating the package's generator with ``async for`` and raising inside the loop left
    it suspended with the inner lock held; the garbage collector closed it later in another task, whose release
    raised "The current task is not holding this lock", and no request was answered again.)  A streamed completion
    of the package whose prompt does not fit the context is refused here with a 400 too: the package would raise
    inside its streamed 200, which the client reads as a dropped connection."""

    def __init__(self, app: ASGIApp, llama: llama_cpp.Llama):
        self.app = app
        self.llama = llama  # the model the package loaded (read here for its vocabulary and context alone)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith("/v1/completions"):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away before its body came
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        try:
            body = _json_object(raw)
            check_fields(body, self.llama.n_vocab())
            _check_package_fields(body)
            ids = await run_in_threadpool(prompt_ids, self.llama, body)
            if _ours(body):
                await self._answer(body, ids, scope, receive, send)
                return
            if body.get("cache_salt") is not None:  # the package would reuse its cached prefix all the same
                raise Refused("cache_salt is read with return_token_ids or prompt_logprobs only (llama-cpp-python's "
                              "own completions reuse the cached prefix)", "cache_salt")
            if not isinstance(body.get("prompt", ""), str) and not isinstance(body["prompt"][0], str):
                raise Refused("a prompt of token ids is answered with return_token_ids or prompt_logprobs only "
                              "(llama-cpp-python's own completions take text)", "prompt")
            check_length(self.llama, ids, 1)  # the package's own rule: the prompt and one token
        except Refused as refused:
            await _refuse(str(refused), refused.param, scope, receive, send)
            return
        await self.app(scope, _replay(raw, receive), send)

    async def _answer(self, body: dict[str, Any], ids: list[int], scope: Scope, receive: Receive,
                      send: Send) -> None:
        scoring = body.get("prompt_logprobs") is not None
        check_length(self.llama, ids, 0 if scoring else _new_tokens(body))
        try:
            # the package's two locks, taken and released as its routes do, in this task on every path
            async with contextlib.asynccontextmanager(server_app.get_llama_proxy)() as proxy:
                llama = proxy(body.get("model"))
                choice = await run_in_threadpool(_score if scoring else _sample, llama, body, ids)
        except Exception as error:  # noqa: BLE001 -- what llama.cpp itself refuses (a failed decode ...)
            raise Refused(f"{type(error).__name__}: {error}") from None
        prompt_tokens = len(choice["prompt_token_ids"])
        await JSONResponse({
            "id": "cmpl-kvlab", "object": "text_completion", "model": body.get("model"), "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(choice.get("token_ids", [])),
                      "total_tokens": prompt_tokens + len(choice.get("token_ids", []))}})(scope, receive, send)


async def _refuse(message: str, param: str | None, scope: Scope, receive: Receive, send: Send) -> None:
    """A 400 in the package's shape (``llama_cpp/server/errors.py`` ErrorResponse), so that a client says why."""
    await JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                  "code": None}}, status_code=400)(scope, receive, send)


def _replay(raw: bytes, receive: Receive) -> Receive:
    """The request's body once more, then the client's own messages (a streamed answer waits on its disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()
    return replayed


def _create_app(*args: Any, **kwargs: Any) -> Any:
    app = original_create_app(*args, **kwargs)  # loads the model (llama_cpp/server/app.py set_llama_proxy)
    app.add_middleware(KVLabFields, llama=server_app._llama_proxy())
    return app


if __name__ == "__main__":
    original_create_app = server_main.create_app
    server_main.create_app = _create_app
    sys.exit(server_main.main())
