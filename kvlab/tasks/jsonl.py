"""User-supplied items from a JSONL file.

One JSON object per line: ``context``, ``question``, ``answer`` (non-empty strings)
and optionally ``id`` (string or integer, unique; default ``line<N>``). Other keys
are kept in ``metadata``. Blank lines are skipped. ``context_lengths`` and ``depths``
do not apply; the measured prompt length is recorded as ``context_length``.
Prompts are ``context + question`` verbatim, so put the separator (e.g. a leading
newline) and the answer prefix in ``question`` yourself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvlab.tasks.haystack import Tokenizer, count_tokens
from kvlab.tasks.items import TaskItem
from kvlab.tasks.scoring import normalize
from kvlab.tasks.spec import TaskSpec

REQUIRED_KEYS = ("context", "question", "answer")
DEFAULT_MAX_NEW_TOKENS = 32


class JsonlTaskError(ValueError):
    """A malformed task file; the message names the file and line."""


def read_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """Validated ``(line number, object)`` pairs, in file order."""
    if not path.is_file():
        raise JsonlTaskError(f"{path}: no such file")
    records = []
    seen_ids: dict[str, int] = {}
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise JsonlTaskError(f"{where}: not valid JSON ({error.msg})") from None
            if not isinstance(record, dict):
                raise JsonlTaskError(
                    f"{where}: expected a JSON object, got {type(record).__name__}"
                )
            missing = [key for key in REQUIRED_KEYS if key not in record]
            if missing:
                raise JsonlTaskError(
                    f"{where}: missing key(s) {missing}; each line needs {list(REQUIRED_KEYS)}"
                )
            for key in REQUIRED_KEYS:
                if not isinstance(record[key], str) or (key != "question" and not record[key]):
                    raise JsonlTaskError(f"{where}: {key!r} must be a non-empty string")
            if not normalize(record["answer"]):
                raise JsonlTaskError(f"{where}: 'answer' has no letters or digits to match")
            item_id = record.get("id", f"line{number}")
            if not isinstance(item_id, (str, int)) or isinstance(item_id, bool):
                raise JsonlTaskError(f"{where}: 'id' must be a string or an integer")
            item_id = str(item_id)
            if item_id in seen_ids:
                raise JsonlTaskError(
                    f"{where}: duplicate id {item_id!r} (first on line {seen_ids[item_id]})"
                )
            seen_ids[item_id] = number
            records.append((number, {**record, "id": item_id}))
    if not records:
        raise JsonlTaskError(f"{path}: no items (the file is empty)")
    return records


def generate(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """Items in file order; at most ``num_items`` if that was set explicitly.

    ``seed`` is unused: the file fixes the items.
    """
    assert spec.path is not None  # TaskSpec guarantees it for jsonl
    records = read_records(Path(spec.path))
    if "num_items" in spec.model_fields_set:
        records = records[: spec.num_items]
    items = []
    for number, record in records:
        context, question = record["context"], record["question"]
        prompt_tokens = count_tokens(tokenizer, context) + count_tokens(tokenizer, question)
        extra = {k: v for k, v in record.items() if k not in (*REQUIRED_KEYS, "id")}
        items.append(
            TaskItem(
                task="jsonl",
                item_id=f"jsonl/{record['id']}",
                context=context,
                question=question,
                answer=record["answer"],
                context_length=prompt_tokens,
                depth=None,
                max_new_tokens=spec.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
                metadata={**extra, "prompt_tokens": prompt_tokens, "line": number},
            )
        )
    return items
