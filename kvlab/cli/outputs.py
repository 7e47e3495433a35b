"""What the CLI writes: text for the terminal (:func:`shown`), and the output files named on the
command line (``--out``, ``--json``), checked before any work is done and written with a message
that names the option and the path when the system refuses."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kvlab.cli.exits import UserError


def shown(value: object, lines: bool = False) -> str:
    """``value`` as text that is safe to print on a terminal: every control or format character
    (the ESC that starts ANSI and OSC sequences, CR, BEL, backspace, a bidi override, and a newline
    unless ``lines``) written as its escape, e.g. ``\\x1b``.  A name, tag or message read from a
    store that others write to can then neither clear the screen, retitle the window nor forge a
    row.  Every printer of the CLI passes stored text through here (errors too, in
    :mod:`kvlab.cli.exits`)."""
    text = str(value)
    if text.isprintable() or (lines and all(line.isprintable() for line in text.split("\n"))):
        return text
    return "".join(c if c.isprintable() or (lines and c == "\n") else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def check_output(path: str, option: str, create_parents: bool = False) -> Path:
    """``path`` as a file this process can write.  Its directory must exist unless ``create_parents``
    (then it is created now, not after an hour-long run).  A symbolic link to a file (or to nothing) is
    refused: writing through it would overwrite or create whatever file it points at (see
    :func:`write_output`); a link to a stream (``/dev/stdout``, a named pipe) writes no file and is kept."""
    out = Path(path)
    if out.is_symlink() and not _links_to_a_stream(out):
        raise UserError(f"{option} {path}: is a symbolic link (to {os.readlink(out)}); kvlab writes no file through "
                        "a link: give the path of the file itself, or remove the link")
    if out.is_dir():
        raise UserError(f"{option} {path}: is a directory; give a file path")
    parent = out.parent
    if not parent.exists():
        if not create_parents:
            raise UserError(f"{option} {path}: the directory {parent} does not exist; create it first")
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserError(f"{option} {path}: cannot create the directory {parent} ({_reason(error)})") from None
    elif not parent.is_dir():
        raise UserError(f"{option} {path}: {parent} is not a directory")
    if not os.access(out if out.exists() else parent, os.W_OK):
        raise UserError(f"{option} {path}: not writable by this user (permission denied)")
    return out


def write_output(path: Path, text: str, option: str) -> None:
    """Write ``text`` to ``path``, never through a symbolic link: one made there after
    :func:`check_output` (during an hour-long run) is refused by the open itself (``O_NOFOLLOW``)."""
    follow = 0 if _links_to_a_stream(path) else os.O_NOFOLLOW
    try:
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | follow, 0o666), "w",
                  encoding="utf-8") as handle:
            handle.write(text)
    except OSError as error:  # a read-only file system, a full disk, permissions os.access missed
        if path.is_symlink():
            raise UserError(f"{option} {path}: became a symbolic link (to {os.readlink(path)}) while kvlab worked; "
                            "nothing was written through it") from None
        raise UserError(f"{option} {path}: cannot write ({_reason(error)})") from None


def _links_to_a_stream(path: Path) -> bool:
    """Whether ``path`` is a symbolic link to something that is not a file (a terminal, a pipe, a
    character device such as ``/dev/null``): writing through it changes no file."""
    try:
        mode = path.stat().st_mode
    except OSError:  # a dangling link: writing through it would create its target
        return False
    return path.is_symlink() and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _reason(error: OSError) -> str:
    return (error.strerror or str(error)).lower()
