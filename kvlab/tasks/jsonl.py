"""User-supplied items from a JSONL file.

One JSON object per line: ``context``, ``question``, ``answer`` (non-empty strings)
and optionally ``id`` (string or integer, unique; default ``line<N>``), ``scorer`` (one of
:data:`kvlab.core.tasks.ANSWER_SCORERS`; default the task's ``scorer``, else ``prefix``) and, for the
``numeric`` scorer, ``tolerance`` (relative, default 1e-6) and ``context_id`` (rows that share one
share their context when the task asks ``questions_per_context`` above 1). Other keys are kept in
``metadata``.
Blank lines are skipped. ``context_lengths`` and ``depths`` do not apply; the measured prompt
length is recorded as ``context_length``.
Prompts are ``context + question`` verbatim, so put the separator (e.g. a leading
newline) and the answer prefix in ``question`` yourself.

The file is read line by line with a bounded ``readline``, so a file or a line over its
limit (:class:`Limits`) is refused after reading at most one line's limit: a 10 MB line
never sits in memory whole. :func:`check_task_files` runs this check when a spec is
loaded, before any model is; :func:`generate` runs it again where the items are built.
"""

from __future__ import annotations

import functools
import json
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import regex

from kvlab.core.errors import ConfigError, HostLacksError
from kvlab.core.items import TaskItem
from kvlab.core.tasks import DEFAULT_ANSWER_SCORER, JsonlParams, TaskSpec, check_answer_scorer, task_new_tokens
from kvlab.core.units import MIB
from kvlab.tasks.haystack import Tokenizer, count_tokens
from kvlab.tasks.scoring import choice_letter, compile_answer_regex, normalize, parse_number

if TYPE_CHECKING:
    from kvlab.core.experiment_spec import ExperimentSpec

REQUIRED_KEYS = ("context", "question", "answer")
DEFAULT_MAX_NEW_TOKENS = task_new_tokens("jsonl")
MAX_ID_CHARS = 256
MAX_INT_DIGITS = 64  # JSON integers longer than this are refused (Python refuses > 4300 with a traceback)

#: Environment variables that raise or lower the limits, and their defaults.
FILE_MB_VAR, DEFAULT_FILE_MB = "KVLAB_MAX_JSONL_MB", 64.0
LINE_MB_VAR, DEFAULT_LINE_MB = "KVLAB_MAX_JSONL_LINE_MB", 1.0
ITEMS_VAR, DEFAULT_ITEMS = "KVLAB_MAX_JSONL_ITEMS", 100_000


class JsonlTaskError(ConfigError):
    """A task file that cannot be used; the one-line message names the file and, where it
    applies, the line."""


class JsonlFileMissingError(JsonlTaskError, HostLacksError):
    """The file does not exist on this host: a worker gives the trials back for a host that has it."""


@dataclass(frozen=True)
class Limits:
    """How large a task file, one of its lines and its item count may be."""

    file_bytes: int = int(DEFAULT_FILE_MB * MIB)
    line_bytes: int = int(DEFAULT_LINE_MB * MIB)
    items: int = DEFAULT_ITEMS

    @classmethod
    def from_env(cls) -> Limits:
        return cls(file_bytes=int(_env_number(FILE_MB_VAR, DEFAULT_FILE_MB) * MIB),
                   line_bytes=int(_env_number(LINE_MB_VAR, DEFAULT_LINE_MB) * MIB),
                   items=int(_env_number(ITEMS_VAR, DEFAULT_ITEMS)))


def _env_number(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive number, got {text!r} (default {default:g})")
    return value


def _mib(n: int) -> str:
    return f"{n / MIB:.3g} MiB"


def show_path(path: str | Path) -> str:
    """``path`` for a one-line message: quoted when it holds a newline or another control character."""
    text = str(path)
    return text if text.isprintable() else repr(text)


class _Refused(ValueError):
    """A JSON value kvlab refuses although the json module would accept it."""


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"a number with more than {MAX_INT_DIGITS} digits")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:20]} is out of range")
    return value


def _parse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for key, value in pairs:
        if key in record:
            raise _Refused(f"duplicate key {key[:40]!r} in one object")
        record[key] = value
    return record


def _decode(line: str) -> Any:
    """One JSON value; :class:`_Refused`, ``json.JSONDecodeError`` or ``RecursionError`` otherwise."""
    return json.loads(line, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant,
                      object_pairs_hook=_unique_keys)


def _open_checked(path: Path, label: str, limits: Limits) -> BinaryIO:
    """The file opened for binary reading, after refusing what is not a regular file within the size limit."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise JsonlFileMissingError(f"{label}: no such file") from None
    except (OSError, ValueError) as error:  # ValueError: a NUL byte in the path
        raise JsonlTaskError(f"{label}: cannot be read ({_reason(error)})") from None
    if stat.S_ISDIR(info.st_mode):
        raise JsonlTaskError(f"{label}: is a directory; give a JSONL file")
    if not stat.S_ISREG(info.st_mode):
        raise JsonlTaskError(f"{label}: is not a regular file (a device, pipe or socket); give a JSONL file")
    if info.st_size == 0:
        raise JsonlTaskError(f"{label}: the file is empty; give one JSON object per line")
    if info.st_size > limits.file_bytes:
        raise JsonlTaskError(f"{label}: the file is {_mib(info.st_size)}, over the limit of "
                             f"{_mib(limits.file_bytes)} (set {FILE_MB_VAR} to raise it)")
    try:
        return path.open("rb")
    except OSError as error:
        raise JsonlTaskError(f"{label}: cannot be read ({_reason(error)})") from None


def _reason(error: Exception) -> str:
    return getattr(error, "strerror", None) or str(error)


def _lines(handle: BinaryIO, label: str, limits: Limits) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each non-blank line, each read with a bounded ``readline``."""
    total = 0
    number = 0
    while raw := handle.readline(limits.line_bytes + 1):
        number += 1
        total += len(raw)
        if len(raw) > limits.line_bytes and not raw.endswith(b"\n"):
            raise JsonlTaskError(f"{label}:{number}: the line is longer than the limit of "
                                 f"{_mib(limits.line_bytes)} (set {LINE_MB_VAR} to raise it)")
        if total > limits.file_bytes:
            raise JsonlTaskError(f"{label}: the file grew over the limit of {_mib(limits.file_bytes)} while "
                                 f"being read (set {FILE_MB_VAR} to raise it)")
        if number == 1:
            raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise JsonlTaskError(f"{label}:{number}: not UTF-8 text (byte 0x{raw[error.start]:02x} at byte "
                                 f"{error.start + 1} of the line); save the file as UTF-8") from None
        if text.strip():
            yield number, text


def _check_record(record: Any, where: str, scorer: str) -> None:
    if not isinstance(record, dict):
        raise JsonlTaskError(f"{where}: expected a JSON object, got {_json_type(record)}")
    missing = [key for key in REQUIRED_KEYS if key not in record]
    if missing:
        raise JsonlTaskError(f"{where}: missing key(s) {missing}; each line needs {list(REQUIRED_KEYS)}")
    for key in REQUIRED_KEYS:
        value = record[key]
        if not isinstance(value, str):
            raise JsonlTaskError(f"{where}: {key!r} must be a{' non-empty' if key != 'question' else ''} "
                                 f"string, got {_json_type(value)}")
        if key != "question" and not value:
            raise JsonlTaskError(f"{where}: {key!r} must be a non-empty string, got \"\"")
        if "\x00" in value:
            raise JsonlTaskError(f"{where}: {key!r} contains a NUL character (\\u0000)")
    if not normalize(record["answer"]):
        raise JsonlTaskError(f"{where}: 'answer' has no letters or digits to match")
    _check_scoring(record, where, scorer)
    context_id = record.get("context_id")
    if context_id is not None and (isinstance(context_id, bool) or not isinstance(context_id, str | int)
                                   or not 0 < len(str(context_id)) <= MAX_ID_CHARS):
        raise JsonlTaskError(f"{where}: 'context_id' must be a string or an integer of 1..{MAX_ID_CHARS} "
                             f"characters, got {_json_type(context_id)}")
    item_id = record.get("id")
    if item_id is not None:
        if isinstance(item_id, bool) or not isinstance(item_id, str | int):
            raise JsonlTaskError(f"{where}: 'id' must be a string or an integer, got {_json_type(item_id)}")
        if isinstance(item_id, str) and not (0 < len(item_id) <= MAX_ID_CHARS and item_id.isprintable()):
            raise JsonlTaskError(f"{where}: 'id' must be 1..{MAX_ID_CHARS} printable characters")
    try:  # a lone surrogate (e.g. "\ud800") parses but can be neither tokenized nor stored
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise JsonlTaskError(f"{where}: contains an invalid \\u escape (a lone surrogate)") from None


def _check_scoring(record: dict[str, Any], where: str, task_scorer: str) -> None:
    """A row's scorer (its own, else the task's ``task_scorer``) must be known and able to read its answer."""
    try:
        scorer = check_answer_scorer(record.get("scorer", task_scorer))
    except ValueError as error:
        raise JsonlTaskError(f"{where}: {error}") from None
    answer = record["answer"]
    if scorer == "numeric" and parse_number(answer.strip()) is None:
        raise JsonlTaskError(f"{where}: scorer 'numeric' needs a number as the answer, got {answer[:40]!r}")
    if scorer == "choice" and choice_letter(answer.upper()) != answer.strip().strip("()").upper():
        raise JsonlTaskError(f"{where}: scorer 'choice' needs one letter A-J as the answer, got {answer[:40]!r}")
    if scorer == "regex":
        try:
            compile_answer_regex(answer)
        except regex.error as error:
            raise JsonlTaskError(f"{where}: the answer is not a regular expression ({error})") from None
    tolerance = record.get("tolerance")
    if tolerance is not None and (scorer != "numeric" or isinstance(tolerance, bool)
                                  or not isinstance(tolerance, int | float) or not 0 <= tolerance < math.inf):
        raise JsonlTaskError(f"{where}: 'tolerance' is for the numeric scorer, a number >= 0; got {tolerance!r}"
                             + ("" if scorer == "numeric" else f" with scorer {scorer!r}"))


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "true/false", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def iter_records(path: str | Path, label: str | None = None, limits: Limits | None = None,
                 scorer: str = DEFAULT_ANSWER_SCORER) -> Iterator[tuple[int, dict[str, Any]]]:
    """Validated ``(line number, object)`` pairs in file order, ``id`` filled in and made a string.

    Raises :class:`JsonlTaskError` at the first problem; ``label`` names the file in messages
    (default: ``path`` itself); ``scorer`` is the task's, which scores the rows without their own.
    """
    path = Path(path)
    label = show_path(label if label is not None else path)
    limits = limits or Limits.from_env()
    seen_ids: dict[str, int] = {}
    with _open_checked(path, label, limits) as handle:
        for number, line in _lines(handle, label, limits):
            where = f"{label}:{number}"
            try:
                record = _decode(line)
            except json.JSONDecodeError as error:
                raise JsonlTaskError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
            except _Refused as error:
                raise JsonlTaskError(f"{where}: not valid JSON ({error})") from None
            except RecursionError:
                raise JsonlTaskError(f"{where}: not valid JSON (nested too deeply)") from None
            _check_record(record, where, scorer)
            item_id = str(record.get("id", f"line{number}"))
            if item_id in seen_ids:
                raise JsonlTaskError(f"{where}: duplicate id {item_id!r} (first on line {seen_ids[item_id]})")
            seen_ids[item_id] = number
            if len(seen_ids) > limits.items:
                raise JsonlTaskError(f"{where}: more than {limits.items} items (set {ITEMS_VAR} to raise it)")
            yield number, {**record, "id": item_id}
    if not seen_ids:
        raise JsonlTaskError(f"{label}: no items (only blank lines); give one JSON object per line")


def read_row(path: str | Path, row: int, label: str | None = None) -> dict[str, Any]:
    """The file's ``row``-th item (1-based, blank lines not counted), validated as :func:`iter_records` does;
    :class:`JsonlTaskError` naming the file for a bad file or a row it does not have."""
    count = 0
    for count, (_, record) in enumerate(iter_records(path, label), start=1):
        if count == row:
            return record
    raise JsonlTaskError(f"{show_path(label if label is not None else path)}: no row {row} "
                         f"(rows 1-{count})")


def validate_file(path: str | Path, label: str | None = None, limits: Limits | None = None,
                  scorer: str = DEFAULT_ANSWER_SCORER) -> int:
    """Check the whole file without keeping its items; return how many it has."""
    return sum(1 for _ in iter_records(path, label, limits, scorer))


def planned_items(spec: TaskSpec) -> int | None:
    """The file's records (at most ``num_items``), or None when the file cannot be read here
    (validation reports why, this count does not)."""
    params = spec.params_as(JsonlParams)
    try:
        status = os.stat(params.path)
        records = _count_records(params.path, status.st_mtime_ns, status.st_size,
                                 params.scorer or DEFAULT_ANSWER_SCORER)
    except (OSError, JsonlTaskError):
        return None
    return records if spec.num_items is None else min(records, spec.num_items)


@functools.lru_cache(maxsize=64)
def _count_records(path: str, mtime_ns: int, size: int, scorer: str) -> int:
    """Records of a jsonl file, cached per version of it (the dashboard asks on every rerun)."""
    return validate_file(path, scorer=scorer)


def check_task_files(spec: ExperimentSpec) -> ExperimentSpec:
    """Validate every jsonl task's file (before any model loads) and return ``spec`` with each
    path made absolute, so that a worker started elsewhere reads the same file. A relative path
    is relative to the current directory."""
    tasks: list[TaskSpec] = []
    for index, task in enumerate(spec.tasks):
        if isinstance(params := task.params, JsonlParams):
            try:
                shared = SharedContexts(show_path(params.path), params.questions_per_context)
                for number, record in iter_records(params.path, scorer=params.scorer or DEFAULT_ANSWER_SCORER):
                    shared.rank(number, record)
            except JsonlTaskError as error:
                raise type(error)(f"tasks.{index}.path: {error}") from None
            absolute = params.model_copy(update={"path": str(Path(params.path).absolute())})
            task = task.model_copy(update={"params": absolute})
        tasks.append(task)
    return spec.model_copy(update={"tasks": tasks})


class SharedContexts:
    """Rows that share a ``context_id`` (with ``questions_per_context`` above 1): each such row's rank
    among its context's rows, in file order; refuses a context whose rows differ in their context
    text or outnumber ``questions_per_context``."""

    def __init__(self, label: str, questions_per_context: int):
        self.label, self.most = label, questions_per_context
        self._rows: dict[str, tuple[int, str, int]] = {}  # context id -> (first line, its context, rows)

    def rank(self, number: int, record: dict[str, Any]) -> tuple[str | None, int]:
        """``(context id, question rank)`` of the row on line ``number``; ``(None, 0)`` when it shares none."""
        if self.most == 1 or record.get("context_id") is None:
            return None, 0
        key = str(record["context_id"])
        first, context, rows = self._rows.get(key, (number, record["context"], 0))
        where = f"{self.label}:{number}"
        if context != record["context"]:
            raise JsonlTaskError(f"{where}: context_id {key!r} has another context than on line {first}: rows "
                                 "that share a context_id must repeat its context exactly")
        if rows >= self.most:
            raise JsonlTaskError(f"{where}: context_id {key!r} has more than questions_per_context = {self.most} "
                                 f"rows (from line {first}); raise questions_per_context or give the rows "
                                 "another context_id")
        self._rows[key] = (first, context, rows + 1)
        return key, rows


def generate(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """Items in file order; at most ``num_items`` when it is given (not None). The whole file is
    validated either way.  With ``questions_per_context`` above 1, rows that share a ``context_id``
    share their context (:class:`SharedContexts`).

    ``seed`` is unused: the file fixes the items.
    """
    params = spec.params_as(JsonlParams)
    scorer = params.scorer or DEFAULT_ANSWER_SCORER
    cap = spec.num_items
    items: list[TaskItem] = []
    shared = SharedContexts(show_path(params.path), params.questions_per_context)
    for number, record in iter_records(params.path, scorer=scorer):
        context_id, rank = shared.rank(number, record)
        if cap is not None and len(items) >= cap:
            continue  # keep reading: a bad line further on still makes the file bad
        items.append(_item(number, record, tokenizer, spec.max_new_tokens, scorer, context_id, rank,
                           params.multi_turn))
    return items


def _item(number: int, record: dict[str, Any], tokenizer: Tokenizer, max_new_tokens: int | None,
          scorer: str, context_id: str | None = None, rank: int = 0, multi_turn: bool = False) -> TaskItem:
    context, question = record["context"], record["question"]
    prompt_tokens = count_tokens(tokenizer, context) + count_tokens(tokenizer, question)
    extra = {k: v for k, v in record.items() if k not in (*REQUIRED_KEYS, "id")}
    return TaskItem(
        task="jsonl",
        item_id=f"jsonl/{record['id']}",
        context=context,
        question=question,
        answer=record["answer"],
        context_length=prompt_tokens,
        depth=None,
        max_new_tokens=max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
        metadata={"scorer": scorer, **extra, "prompt_tokens": prompt_tokens, "line": number},  # a row's own wins
        context_id=None if context_id is None else f"jsonl/{context_id}", question_rank=rank, multi_turn=multi_turn,
    )

