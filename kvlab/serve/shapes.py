"""OpenAI's response shapes: completions and chat completions, whole or as stream chunks."""

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


class CompletionShape:
    object_full, object_chunk = "text_completion", "text_completion"

    def __init__(self, model: str):
        self.model, self.id, self.created = model, f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def choice(self, text: str, finish_reason: str | None, first: bool) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def chunk(self, text: str, finish_reason: str | None, first: bool) -> dict[str, Any]:
        return self._envelope(self.object_chunk) | {"choices": [self.choice(text, finish_reason, first)]}

    def usage_chunk(self, finished: Finished) -> dict[str, Any]:
        return self._envelope(self.object_chunk) | {"choices": [], "usage": usage(finished)}

    def full(self, text: str, finished: Finished) -> dict[str, Any]:
        return self._envelope(self.object_full) | {
            "choices": [self.choice(text, finished.finish_reason, True)], "usage": usage(finished),
            "kv_cache": finished.kv_cache}


class ChatShape(CompletionShape):
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
            "usage": usage(finished), "kv_cache": finished.kv_cache}
