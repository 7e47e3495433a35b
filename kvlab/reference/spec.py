"""The spec reference page: every table of a spec file, from its pydantic model."""

from __future__ import annotations

from kvlab.core.experiment_spec import BackendSpec, ExperimentSpec, Resources, ServerOptions
from kvlab.core.kv_config import DecodePolicy, KVCacheConfig, SkipLayers, SweepGrid
from kvlab.core.load_spec import LoadSpec, LoadTarget
from kvlab.core.tasks import TASKS, TaskSpec
from kvlab.core.tune_spec import TuneSpec
from kvlab.reference.schema import model_section

INTRO = """# Spec reference

Generated from the pydantic models of `kvlab/core/` (`python -m kvlab.reference`). A spec is a TOML file
(`kvlab run SPEC`, `kvlab tune SPEC`, the dashboard's upload); an unknown key, a value out of its bounds
or a combination that cannot run is refused with the field and what is allowed, before any model loads.
[Write a spec](../howto/specs.md) shows one whole; the [registries](registries.md) list the names.
"""


def spec_page() -> str:
    """The spec reference page."""
    sections = [
        INTRO,
        model_section(ExperimentSpec, "The spec's top level"),
        model_section(BackendSpec, "`[backend]`"),
        model_section(ServerOptions, "`[backend.server]`"),
        model_section(TaskSpec, "`[[tasks]]`", skip=("params",)),
        "Beside these, a task's table holds the task's own parameters:\n",
    ]
    described = set()
    for task in TASKS.values():
        if task.params.model_fields and task.params not in described:
            described.add(task.params)
            sections.append(model_section(task.params, f"`{task.name}` parameters", level=3))
    sections += [
        model_section(KVCacheConfig, "`[[configs]]`"),
        model_section(DecodePolicy, "`decode` of a config", level=3),
        model_section(SkipLayers, "`skip_layers` of a config", level=3),
        model_section(SweepGrid, "`[sweep]`"),
        model_section(LoadSpec, "`[load]`"),
        model_section(LoadTarget, "`[load.target]`", level=3),
        model_section(TuneSpec, "`[tune]`"),
        model_section(Resources, "`[resources]`"),
    ]
    return "\n".join(sections).rstrip() + "\n"
