"""The CLI's exit policy: every command ends in one of these, never in a Python traceback.

====  =====================================================================================
0     success
2     a user error: a bad option, file, spec, database or endpoint.  One line on stderr,
      ``error: <option, file or field>: <what is wrong / allowed>``.  argparse's own errors
      (unknown option, bad number) are the same one line.
1     an internal error (a bug).  One line, ``error: internal error (<Type>: <message>);
      details in <log>``; the traceback is appended to that log (see :mod:`kvlab.errlog`).
      Also a failure of what the command stood on, neither a bug nor the input (its store lost
      under a running worker): one line, ``error: <message>``.
130   interrupted (Ctrl-C).
141   the reader of stdout went away (``kvlab show 3 | head -1``): the rest of the output is
      dropped silently and the status is the one a shell reports for any program a closed pipe
      stops (128 + SIGPIPE), so ``set -o pipefail`` scripts see the output was cut.
====  =====================================================================================

``KVLAB_DEBUG=1`` re-raises errors of both kinds, showing the traceback.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from kvlab.errlog import debug_enabled, log_details, one_line
from kvlab.secrets import redact

EXIT_INTERNAL, EXIT_USER = 1, 2
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141
LOG_NAME = "cli"

#: Errors whose message tells the user what to fix, by (module, name).
USER_ERRORS = (("kvlab.cli.exits", "UserError"), ("kvlab.core.errors", "ConfigError"),
               ("kvlab.store.errors", "StoreError"), ("kvlab.engines.base", "EngineFailure"),
               ("kvlab.core.model_registry", "ModelNotAvailableError"))
#: Errors that stopped the command under it (exit 1, their message alone); checked before USER_ERRORS,
#: of which they may be subclasses.
FAILURES = (("kvlab.store.errors", "StoreLost"),)
#: Whether this command ended because its store was lost under it (see :func:`exit_process`).
_store_lost = False


class UserError(Exception):
    """A bad argument or file; the message names it and says what is allowed."""


def user_error_types(names: Sequence[tuple[str, str]] = USER_ERRORS) -> tuple[type[BaseException], ...]:
    """The classes of ``names`` among the modules already imported.  An error of a module that was
    never imported cannot have been raised, and importing ``kvlab.models`` only to name its error
    would add seconds of torch imports to every command."""
    loaded = (getattr(sys.modules.get(module), name, None) for module, name in names)
    return tuple(kind for kind in loaded if isinstance(kind, type))


def run(command: Callable[[], int], argv: Sequence[str]) -> int:
    """Run ``command`` (a parsed subcommand) and map how it ended to an exit status."""
    try:
        status = command()
        sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe is an "Exception ignored"
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        _say("interrupted")
        return EXIT_INTERRUPTED
    except Exception as error:
        if debug_enabled():
            raise
        if isinstance(error, user_error_types(FAILURES)):
            global _store_lost
            _store_lost = True
            _say(f"error: {one_line(redact(str(error)))}")
            return EXIT_INTERNAL
        if isinstance(error, user_error_types()):
            return user_error(str(error), argv)
        return internal_error(error, argv)


def exit_process(status: int) -> NoReturn:
    """End the process with ``status``.  After a lost store, at once (``os._exit``): the interpreter's
    teardown would close its SQLite connections and checkpoint into files whose directory went read-only
    under their mapped ``-shm`` -- which a probe saw end in SIGBUS (exit -7) after the right message."""
    if _store_lost:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)
    sys.exit(status)


def user_error(message: str, argv: Sequence[str]) -> int:
    """Say ``message`` on one line; a longer one is cut and written whole to the log."""
    line = one_line(redact(message))
    if line != one_line(redact(message), limit=sys.maxsize):
        path = log_details(LOG_NAME, f"{_command_line(argv)} (exit {EXIT_USER})", text=message)
        line = f"{line} (the whole message is in {path})"
    _say(f"error: {line}")
    return EXIT_USER


def internal_error(error: BaseException, argv: Sequence[str]) -> int:
    path = log_details(LOG_NAME, f"{_command_line(argv)} (exit {EXIT_INTERNAL})", error)
    _say(f"error: internal error ({type(error).__name__}: {one_line(redact(str(error)), 160)}); details in {path}")
    return EXIT_INTERNAL


def _command_line(argv: Sequence[str]) -> str:
    return shlex.join(["kvlab", *argv])


def _say(line: str) -> None:
    from kvlab.cli.outputs import shown  # here: outputs imports this module

    try:
        print(shown(line), file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):  # stderr closed too: nobody to tell
        pass


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush has nowhere to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (a test's capture): nothing left to flush
        pass
