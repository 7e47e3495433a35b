"""The playground's request bounds are the task's own (issue 47 row 15: the API reference said ``context_length ≥ 16``
where a generated item needs 128): one place defines them, the request model and the generated reference state it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvlab.core.tasks import MAX_CONTEXT_LENGTH, MIN_CONTEXT_LENGTH
from kvlab.paths import REPO_ROOT
from kvlab.serve.playground import PlaygroundRequest


@pytest.mark.parametrize("length", [16, MIN_CONTEXT_LENGTH - 1, MAX_CONTEXT_LENGTH + 1])
def test_a_context_length_outside_the_tasks_bounds_is_refused_by_the_request_naming_its_field(length):
    with pytest.raises(ValidationError) as refused:
        PlaygroundRequest(model="m", item={"task": "passkey", "context_length": length})
    (problem,) = refused.value.errors()
    assert problem["loc"][-1] == "context_length", problem


def test_the_api_reference_states_the_tasks_bounds():
    page = (REPO_ROOT / "docs" / "reference" / "http-api.md").read_text(encoding="utf-8")
    (row,) = [line for line in page.splitlines() if line.startswith("| `context_length` |")]
    assert f"≥ {MIN_CONTEXT_LENGTH}, ≤ {MAX_CONTEXT_LENGTH}" in row, row
