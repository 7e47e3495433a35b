"""llama-cpp-python's OpenAI-compatible server, with the two completion fields of vLLM that kvlab's sampled fidelity
estimator reads, computed from llama.cpp's own logits.

kvlab runs this file with the interpreter of the llama.cpp venv (``scripts/install_llamacpp.sh``), as a script: it
imports llama_cpp and its server's packages only, never kvlab.  Everything but the two fields is the package's own
server, unchanged (``llama_cpp.server.__main__.main``: the same flags, routes, locks and model).

Why not the package's ``echo`` + ``logprobs``: in llama-cpp-python 0.3.36 (``llama_cpp/llama.py``,
``Llama._create_completion``) an echoed prompt token's log-probability is read from its own position's logits, which
predict the *next* token (measured: after "The", " capital" is scored by the row whose top token is " of"), and every
position sorts the whole vocabulary in Python.  The fields added here, as vLLM 0.32 answers them:

- ``return_token_ids``: the choice carries ``prompt_token_ids`` and ``token_ids`` (sampled by the package's own
  ``Llama.generate`` with the request's sampling fields and seed);
- ``prompt_logprobs`` (k): the choice carries one entry per prompt token (None for the first; else
  ``{token id: {"logprob", "rank", "decoded_token"}}`` for the token given and the top k), from the logits of the
  position before it, in the cache this server holds (the prompt's prefix that is already cached is reused, as the
  package's generation reuses it).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import llama_cpp
import llama_cpp.server.__main__ as server_main
import numpy as np
from llama_cpp.server import app as server_app
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ROWS_PER_CHUNK = 64  # log-softmax this many positions at a time (a row is the whole vocabulary)
#: The most top log-probabilities a position may ask for: vLLM's default max_logprobs, which refuses more (every
#: prompt position carries that many entries, so an unbounded k is an unbounded answer)
MAX_TOP_LOGPROBS = 20


def _sample(llama: llama_cpp.Llama, body: dict[str, Any]) -> dict[str, Any]:
    """A sampled completion with its token ids (``return_token_ids``)."""
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    prompt_ids = (list(prompt) if isinstance(prompt, list)
                  else llama.tokenize(str(prompt).encode("utf-8"), special=True))
    if body.get("seed") is not None:
        llama.set_seed(int(body["seed"]))
    temperature = float(body.get("temperature", 1.0))
    tokens: list[int] = []
    finish = "length"
    for token in llama.generate(prompt_ids, top_k=int(body.get("top_k", 40)), top_p=float(body.get("top_p", 1.0)),
                                min_p=float(body.get("min_p", 0.05)), temp=temperature,
                                repeat_penalty=float(body.get("repeat_penalty", 1.0))):
        if llama_cpp.llama_vocab_is_eog(llama._model.vocab, token):
            finish = "stop"
            break
        tokens.append(token)
        if len(tokens) >= int(body.get("max_tokens") or 16):
            break
    text = llama.detokenize(tokens, prev_tokens=prompt_ids).decode("utf-8", errors="ignore")
    return {"text": text, "index": 0, "finish_reason": finish, "logprobs": None, "prompt_token_ids": prompt_ids,
            "token_ids": tokens}


def _score(llama: llama_cpp.Llama, body: dict[str, Any]) -> dict[str, Any]:
    """Every prompt token's log-probability and the top ``prompt_logprobs`` at its position (vLLM's shape)."""
    prompt = body.get("prompt", "")
    ids = list(prompt) if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) else \
        llama.tokenize(str(prompt).encode("utf-8"), special=True)
    top = max(int(body.get("prompt_logprobs") or 1), 1)
    if top > MAX_TOP_LOGPROBS:
        raise ValueError(f"prompt_logprobs = {top}: at most {MAX_TOP_LOGPROBS} top log-probabilities per position")
    # One generation step evaluates what of the prompt is not cached yet (the package's own prefix reuse); with
    # logits_all, llama.scores then holds every position's logits.
    next(iter(llama.generate(ids, temp=0.0)), None)
    entries: list[dict[str, dict[str, Any]] | None] = [None]
    for start in range(0, len(ids) - 1, ROWS_PER_CHUNK):
        rows = np.asarray(llama.scores[start:min(start + ROWS_PER_CHUNK, len(ids) - 1)], dtype=np.float64)
        rows -= rows.max(axis=1, keepdims=True)
        logprobs = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
        for offset, row in enumerate(logprobs):
            token = ids[start + offset + 1]
            best = np.argpartition(-row, top - 1)[:top] if top < row.size else np.arange(row.size)
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


class KVLabFields:
    """ASGI middleware: a ``POST /v1/completions`` that asks for ``prompt_logprobs`` or ``return_token_ids`` is
    answered here, under the package's own model locks; every other request goes to the package's server."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith("/v1/completions"):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        if not isinstance(body, dict) or not (body.get("prompt_logprobs") or body.get("return_token_ids")):
            await self.app(scope, _replay(raw, receive), send)
            return
        try:
            async for proxy in server_app.get_llama_proxy():  # the package's two locks, as its routes take them
                llama = proxy(body.get("model"))
                choice = await run_in_threadpool(_score if body.get("prompt_logprobs") else _sample, llama, body)
        except Exception as error:  # noqa: BLE001 -- a request llama.cpp cannot answer (longer than its context...)
            # answered as the package answers a bad request, so that the client says why in one line
            await JSONResponse({"error": {"message": f"{type(error).__name__}: {error}",
                                          "type": "invalid_request_error"}}, status_code=400)(scope, receive, send)
            return
        prompt_tokens = len(choice["prompt_token_ids"])
        await JSONResponse({
            "id": "cmpl-kvlab", "object": "text_completion", "model": body.get("model"), "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(choice.get("token_ids", [])),
                      "total_tokens": prompt_tokens + len(choice.get("token_ids", []))}})(scope, receive, send)


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
    app = original_create_app(*args, **kwargs)
    app.add_middleware(KVLabFields)
    return app


if __name__ == "__main__":
    original_create_app = server_main.create_app
    server_main.create_app = _create_app
    sys.exit(server_main.main())
