"""A model file or directory that kvlab cannot use as it is: the user's input, so one line and exit 2.

The libraries that read checkpoints (gguf, transformers, safetensors) answer a file that is not
what it claims with their own errors -- ``ValueError: GGUF magic invalid``, a numpy dtype
complaint for a truncated file, ``OSError`` for missing weights, a ``SafetensorError`` for a
broken header -- which would otherwise reach the CLI as internal errors.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvlab.core.errors import ConfigError
from kvlab.errlog import one_line


class ModelFileError(ConfigError):
    """A model file or directory that cannot be loaded (not a GGUF, custom code, broken weights);
    the message names it and says why."""


def _unreadable() -> tuple[type[BaseException], ...]:
    """What reading a checkpoint raises when its files are not what they claim."""
    from safetensors import SafetensorError

    return (OSError, ValueError, KeyError, IndexError, EOFError, struct.error, SafetensorError)


@contextmanager
def reading(path: Path, what: str) -> Iterator[None]:
    """Around the libraries' reading of ``path``: their errors become :class:`ModelFileError`
    ``<path>: <what> (<their message>)``; kvlab's own errors pass through."""
    try:
        yield
    except ConfigError:
        raise
    except _unreadable() as error:
        reason = one_line(str(error), 300) or type(error).__name__
        raise ModelFileError(f"{path}: {what} ({reason})") from error
