"""``kvlab serve``: the embedded engine behind an OpenAI-compatible HTTP API.

Any OpenAI client (and kvlab's own ``openai_compat`` backend) can then measure a KV-cache
config through the same path it would use for vLLM or SGLang.  Endpoints: ``/v1/models``,
``/v1/completions``, ``/v1/chat/completions`` (both streaming too), ``/health`` and
``/metrics`` (Prometheus).  A request may carry a ``kv_cache`` object (kvlab's extension, like
vLLM's extra sampling fields) to override the server's KV-cache config for that request;
responses report the cache that request really held under ``kv_cache``.  Faults never hang it:
a client that leaves stops its generation, SIGTERM stops the server in seconds, bodies over the
limit get a 413 unread, and every error is OpenAI-shaped JSON counted under its status.
"""

from kvlab.serve.app import create_app
from kvlab.serve.generation import ServedModel

__all__ = ["ServedModel", "create_app"]
