"""The margins are declared once, on the spec's fields: `kvlab run`'s options and the form's inputs take and
refuse what the spec does, at each bound, and say the spec's help."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from kvlab.cli.options import add_margin_options, margin_overrides
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ExperimentSpec, parse_spec
from kvlab.core.margin_inputs import MARGIN_INPUTS, RESOLUTION

SPEC = {"name": "margins", "model": "smollm2-135m", "tasks": [{"name": "passkey", "num_items": 2}],
        "configs": [{"quant": "int4"}]}


def _spec_takes(name: str, value: float) -> bool:
    try:
        parse_spec(SPEC | {name: value})
    except (ValidationError, ConfigError):
        return False
    return True


def _option_takes(name: str, value: float) -> bool:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_margin_options(parser)
    try:
        args = parser.parse_args([MARGIN_INPUTS[name].flag, repr(value)])
    except (argparse.ArgumentError, SystemExit):
        return False
    return margin_overrides(args) == {name: value}


@pytest.mark.parametrize("name", list(MARGIN_INPUTS))
def test_the_option_and_the_form_take_what_the_spec_takes(name):
    margin = MARGIN_INPUTS[name]
    assert set(MARGIN_INPUTS) <= set(ExperimentSpec.model_fields)
    for value in (margin.low, margin.high, margin.low - RESOLUTION, margin.high + RESOLUTION, margin.form_low,
                  margin.form_high, margin.default):
        assert _option_takes(name, value) == _spec_takes(name, value), value
    assert _spec_takes(name, margin.form_low) and _spec_takes(name, margin.form_high)  # the form's ends are valid
    assert _spec_takes(name, margin.low) != margin.low_open and _spec_takes(name, margin.high) != margin.high_open
    assert margin.help == ExperimentSpec.model_fields[name].description and margin.help
