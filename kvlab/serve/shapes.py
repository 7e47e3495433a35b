"""OpenAI's response shapes: completions and chat completions, whole or as stream chunks, with vLLM's
fields where a request asks for them (vLLM 0.32, ``vllm/entrypoints/openai/*/protocol.py``):

- ``return_token_ids``: the prompt's ids (``prompt_token_ids``) and the generated ids (``token_ids``) --
  on a completion's choice, on a chat completion's top level (prompt) and choice (generated); streamed,
  the prompt's ids ride on the first chunk only and each chunk carries the ids it adds;
- ``prompt_logprobs``: on a completion's choice, on a chat completion's top level (whole responses only).

kvlab's own: ``kv_cache`` (the request's cache, measured) and ``kv_cache_prompt_split``
(``[context tokens, question tokens]``: how the prompt was laid out, the rest being teacher-forced).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from kvlab.serve.generation import Finished


def usage(finished: Finished) -> dict[str, int]:
    return {"prompt_tokens": finished.prompt_tokens, "completion_tokens": finished.completion_tokens,
            "total_tokens": finished.prompt_tokens + finished.completion_tokens}


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(payload)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def _kvlab_fields(finished: Finished) -> dict[str, Any]:
    return {"kv_cache": finished.kv_cache} | (
        {"kv_cache_prompt_split": finished.prompt.split} if finished.prompt is not None else {})


class CompletionShape:
    object_full, object_chunk = "text_completion", "text_completion"

    def __init__(self, model: str, prompt_ids: list[int] | None = None):
        """``prompt_ids``: the prompt's token ids, returned with the generated ones (``return_token_ids``)."""
        self.model, self.id, self.created = model, f"cmpl-{uuid.uuid4().hex}", int(time.time())
        self.prompt_ids = prompt_ids

    @property
    def token_ids(self) -> bool:
        return self.prompt_ids is not None

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def choice(self, text: str, finish_reason: str | None, first: bool, token_ids: list[int]) -> dict[str, Any]:
        ids: dict[str, Any] = {"token_ids": token_ids} | ({"prompt_token_ids": self.prompt_ids} if first else {})
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason} | (
            ids if self.token_ids else {})

    def chunk(self, text: str, finish_reason: str | None, first: bool, token_ids: list[int]) -> dict[str, Any]:
        """One stream chunk: its text, and the token ids it adds."""
        return self._envelope(self.object_chunk) | {"choices": [self.choice(text, finish_reason, first, token_ids)]}

    def last_chunk(self, finished: Finished, first: bool, token_ids: list[int]) -> dict[str, Any]:
        return self.chunk("", finished.finish_reason, first, token_ids) | _kvlab_fields(finished)

    def usage_chunk(self, finished: Finished) -> dict[str, Any]:
        return self._envelope(self.object_chunk) | {"choices": [], "usage": usage(finished)}

    def full(self, text: str, finished: Finished) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finished.finish_reason,
                  "token_ids": finished.token_ids if self.token_ids else None,
                  "prompt_logprobs": finished.prompt_logprobs, "prompt_token_ids": self.prompt_ids}
        return self._envelope(self.object_full) | {"choices": [choice], "usage": usage(finished)} | _kvlab_fields(
            finished)


class ChatShape(CompletionShape):
    object_full, object_chunk = "chat.completion", "chat.completion.chunk"

    def __init__(self, model: str, prompt_ids: list[int] | None = None):
        super().__init__(model, prompt_ids)
        self.id = f"chatcmpl-{uuid.uuid4().hex}"

    def choice(self, text: str, finish_reason: str | None, first: bool, token_ids: list[int]) -> dict[str, Any]:
        delta: dict[str, Any] = {"content": text} | ({"role": "assistant"} if first else {})
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason} | (
            {"token_ids": token_ids} if self.token_ids else {})

    def chunk(self, text: str, finish_reason: str | None, first: bool, token_ids: list[int]) -> dict[str, Any]:
        return super().chunk(text, finish_reason, first, token_ids) | (
            {"prompt_token_ids": self.prompt_ids} if first and self.token_ids else {})

    def full(self, text: str, finished: Finished) -> dict[str, Any]:
        return self._envelope(self.object_full) | {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finished.finish_reason,
                         "token_ids": finished.token_ids if self.token_ids else None}],
            "usage": usage(finished), "prompt_logprobs": finished.prompt_logprobs,
            "prompt_token_ids": self.prompt_ids} | _kvlab_fields(finished)
