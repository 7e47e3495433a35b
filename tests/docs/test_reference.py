"""The generated reference is the code's: the committed pages equal what the code generates now, and what the
reference documents cannot go undescribed (a spec field without a description, a CLI argument or command
without help, a route without a docstring fail the generation, so the suite)."""

from __future__ import annotations

import argparse

import pytest
from pydantic import BaseModel, Field

from kvlab.reference import MissingText
from kvlab.reference.__main__ import PAGES, REFERENCE_DIR
from kvlab.reference.cli import cli_page
from kvlab.reference.schema import model_section, model_table


@pytest.mark.parametrize("page", sorted(PAGES))
def test_committed_page_is_what_the_code_generates(page):
    committed = (REFERENCE_DIR / page).read_text(encoding="utf-8")
    assert committed == PAGES[page](), f"docs/reference/{page} differs from the code: run `python -m kvlab.reference`"


def test_a_spec_field_without_a_description_fails():
    class Spec(BaseModel):
        said: int = Field(default=1, description="a field that says what it is")
        unsaid: int = 2

    with pytest.raises(MissingText) as raised:
        model_table(Spec)
    assert raised.value.missing == ["Spec.unsaid"]


def test_a_new_kvcacheconfig_field_without_a_description_fails():
    from kvlab.core.kv_config import KVCacheConfig

    class Extended(KVCacheConfig):
        new_knob: int = 0

    with pytest.raises(MissingText, match="Extended.new_knob"):
        model_section(Extended, "[[configs]]")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvlab")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run a spec")
    run.add_argument("spec", help="the spec")
    run.add_argument("--hidden", help=argparse.SUPPRESS)
    return parser


def test_the_cli_page_of_a_parser_that_says_everything():
    page = cli_page(_parser())
    assert "## `kvlab run`" in page and "| `spec` |" in page and "--hidden" not in page


def test_a_cli_flag_without_help_fails():
    parser = _parser()
    run = parser._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    run.add_argument("--new-flag", type=int)
    with pytest.raises(MissingText) as raised:
        cli_page(parser)
    assert raised.value.missing == ["kvlab run --new-flag NEW_FLAG"]


def test_a_command_without_help_fails():
    parser = _parser()
    parser._subparsers._group_actions[0].add_parser("bare")  # type: ignore[union-attr]
    with pytest.raises(MissingText, match="kvlab bare"):
        cli_page(parser)


def test_a_module_without_a_docstring_fails_the_layout_page(tmp_path):
    from kvlab.reference.layout import layout_page

    for path, text in {"kvlab/core/said.py": '"""A module that says what it is."""\n',
                       "kvlab/core/unsaid.py": "X = 1\n", "pages/page.py": '"""A page."""\n',
                       "app.py": '"""The app."""\n'}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    with pytest.raises(MissingText) as raised:
        layout_page(tmp_path)
    assert raised.value.missing == ["kvlab/core/unsaid.py"]
    (tmp_path / "kvlab/core/unsaid.py").write_text('"""Now it says."""\nX = 1\n')
    page = layout_page(tmp_path)
    assert "## `kvlab/core/`" in page and "| `unsaid.py` | Now it says. |" in page
    assert "| `pages/page.py` | A page. |" in page
