"""The libraries' own output while kvlab loads or converts a model: off unless asked for.

transformers and huggingface_hub log warnings and draw a progress bar per file or tensor (a GGUF
conversion redraws one line per tensor, the weight loader one "Materializing param" line per
tensor): 168 KB in a set-up log.  kvlab prints one line per step instead, and one bar for the long
step that only a terminal shows.  ``--verbose`` (or ``KVLAB_VERBOSE=1``, which worker processes
inherit) shows the libraries' output as they write it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

VERBOSE_ENV = "KVLAB_VERBOSE"


def verbose_enabled() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def set_verbose() -> None:
    """Show the libraries' output in this process and in the workers it starts."""
    os.environ[VERBOSE_ENV] = "1"


def _step_bar(iterable: Iterable[Any], *_args: Any, **_kwargs: Any) -> Iterable[Any]:
    """The GGUF conversion's per-tensor loop as one bar, drawn on a terminal only (``disable=None``)."""
    from tqdm import tqdm

    return tqdm(iterable, desc="  dequantizing", unit=" tensors", disable=None, leave=False, mininterval=0.5)


@contextmanager
def library_output() -> Iterator[None]:
    """Within this block, transformers logs errors only, and its and huggingface_hub's bars are off
    (unless :func:`verbose_enabled`); the previous settings come back afterwards."""
    if verbose_enabled():
        yield
        return
    import transformers.modeling_gguf_pytorch_utils as gguf_loading
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    verbosity, bars = transformers_logging.get_verbosity(), transformers_logging.is_progress_bar_enabled()
    hub_bars, gguf_bar = not are_progress_bars_disabled(), gguf_loading.tqdm
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    disable_progress_bars()
    gguf_loading.tqdm = _step_bar  # the library's own tqdm, not transformers' switchable one
    try:
        yield
    finally:
        gguf_loading.tqdm = gguf_bar
        transformers_logging.set_verbosity(verbosity)
        if bars:
            transformers_logging.enable_progress_bar()
        if hub_bars:
            enable_progress_bars()
