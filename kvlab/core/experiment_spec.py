"""The experiment spec: model, backend, tasks, configs, margins; validated, and in and out of dicts and TOML.

Validation here tells what the spec alone tells, the same on every host (a stored spec parses the
same everywhere); what this host's files tell (a local model's context, a jsonl file's rows) is
checked by :mod:`kvlab.spec_files` before anything is stored.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

import tomli_w
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kvlab.core.backends import BACKENDS
from kvlab.core.errors import ConfigError
from kvlab.core.key_vars import key_var_problem
from kvlab.core.kv_config import BASELINE, KVCacheConfig, SweepGrid
from kvlab.core.limits import (
    CONFIGS,
    ITEM_EVALS,
    ITEMS,
    MAX_NOTES_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    TASKS,
    FieldProblem,
    check_text,
)
from kvlab.core.load_spec import LoadSpec
from kvlab.core.margin_inputs import MARGIN_INPUTS
from kvlab.core.margins import Margins
from kvlab.core.model_registry import context_limit, model_depth
from kvlab.core.tasks import MAX_PATH_CHARS, STORED, TaskSpec
from kvlab.core.tasks import TASKS as TASK_REGISTRY
from kvlab.core.tune_spec import TuneSpec, backend_space
from kvlab.core.urls import URL_USERINFO, url_credentials


def _known_backend(kind: str) -> str:
    if kind not in BACKENDS:
        raise ValueError(f"'{kind}' is not a backend; one of {', '.join(BACKENDS)} (`kvlab engines` lists them)")
    return kind


#: A name of the backend registry, checked when a spec is read (not a ``Literal``: a plugin's backends are known
#: only once the registry is first read)
BackendKind = Annotated[str, AfterValidator(_known_backend)]

#: A spec is a few KB; anything near this is not a spec (and would be read whole into memory).
MAX_SPEC_BYTES = 1 << 20


#: The KV pool vLLM's CPU build gets when the spec does not size it: 1 GiB holds 46,592 bf16 tokens
#: of SmolLM2-135M (measured), room for the longest context it takes at several requests at once.
DEFAULT_CPU_KV_CACHE_GIB = 1.0


class ServerOptions(BaseModel):
    """How kvlab launches a serving engine's server (the backends that launch one).

    The engine settings (:attr:`ENGINE_SETTINGS`) are kvlab's names for what serving engines size or switch: each
    engine declares its own flag for those it takes and refuses the others when set
    (:attr:`~kvlab.engines.servers.base.ServingEngine.setting_flags`; the reference's "Server settings by engine"
    table is generated from those declarations).  A setting is set when it differs from its default, which a JSON
    round trip keeps.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: The settings an engine maps to a flag of its own, or refuses.
    ENGINE_SETTINGS: ClassVar[tuple[str, ...]] = (
        "memory_fraction", "kv_cache_gib", "max_model_len", "prefix_cache", "enforce_eager")

    python: str | None = Field(
        default=None, description="The interpreter that has the engine installed; unset: the venv kvlab's install "
        "script for it made ($KVLAB_HOME/engines/<kind>, e.g. scripts/install_vllm.sh), else `python` on the PATH.")
    host: str = Field(default="127.0.0.1", description="The address the launched server listens on.")
    port: Annotated[int, Field(ge=0, le=65535)] = Field(default=0, description="Its port; 0: a free one.")
    memory_fraction: Annotated[float, Field(gt=0.0, le=1.0)] | None = Field(
        default=None, description="The KV pool as a fraction of the accelerator's memory, for an engine that sizes "
        "it so (its flag: the server settings table); or kv_cache_gib, not both.")
    kv_cache_gib: Annotated[float, Field(gt=0.0, le=4096)] | None = Field(
        default=None, description=f"The KV pool in GiB, for an engine that sizes it in bytes; unset: "
        f"{DEFAULT_CPU_KV_CACHE_GIB:g} on a CPU build that cannot size it by a fraction, else the engine sizes it.")
    max_model_len: Annotated[int, Field(ge=128)] | None = Field(
        default=None, description="The longest sequence the server takes (its context); unset: the model's.")
    prefix_cache: bool = Field(default=True, description="false: the server does not reuse cached prefixes across "
                               "requests, for an engine that can turn that off.")
    enforce_eager: bool | None = Field(
        default=None, description="Run the model eagerly, without compiled graphs, for an engine that has the "
        "choice; unset: eager on a CPU build (compiling takes minutes there and does not reload), the engine's "
        "default elsewhere.")
    startup_timeout_s: Annotated[float, Field(gt=0)] = Field(
        default=900.0, description="Seconds to wait for the server's health check before the config fails.")
    extra_args: list[str] = Field(default=[], description="More command-line arguments for the server, as is.")

    @model_validator(mode="after")
    def _one_pool_size(self) -> ServerOptions:
        if self.memory_fraction is not None and self.kv_cache_gib is not None:
            raise ValueError("give memory_fraction or kv_cache_gib, not both: an engine sizes its KV pool by one of "
                             "them")
        return self

    def engine_settings_set(self) -> list[str]:
        """The engine settings that differ from their defaults, in :attr:`ENGINE_SETTINGS`' order."""
        return [name for name in self.ENGINE_SETTINGS
                if getattr(self, name) != type(self).model_fields[name].get_default()]


class BackendSpec(BaseModel):
    """Where the model runs.

    Secrets never live here: ``api_key_env`` names the environment variable (or the key of
    ``.streamlit/secrets.toml``) that holds the key, and a ``base_url`` with ``user:password@``
    is refused (:func:`refuse_credentials`).  ``base_url`` and ``model_id`` of an
    ``openai_compat`` backend may also come from ``KVLAB_BASE_URL`` / ``KVLAB_MODEL_ID``.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: BackendKind = Field(default="embedded", description="Where the model runs: a name of the backend "
                              "registry (see the backends table), or of a backend a package plugs in "
                              "(`kvlab engines` lists them).")
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="The embedded engine's device; auto: cuda where torch sees a GPU, else cpu.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="The dtype the model computes in (embedded: auto is float32 on a CPU, bfloat16 "
        "on a GPU; a launched server: its --dtype).")
    base_url: str | None = Field(
        default=None, description="openai_compat: the endpoint, e.g. http://127.0.0.1:8000/v1 (else "
        "KVLAB_BASE_URL); never with user:password@.")
    model_id: str | None = Field(
        default=None, description="The model name the server serves (openai_compat: else KVLAB_MODEL_ID; vllm / "
        "sglang: default `model`).")
    api_key_env: str = Field(default="KVLAB_API_KEY", description="The environment variable (or key of "
                             ".streamlit/secrets.toml) holding the API key, named <NAME>_API_KEY; the key itself is "
                             "never in a spec.")
    max_concurrency: Annotated[int, Field(ge=1, le=256)] = Field(
        default=4, description="Requests in flight at once to a server.")
    max_retries: Annotated[int, Field(ge=0, le=20)] = Field(
        default=3, description="Retries of a 429, a 5xx or a dropped connection, with exponential backoff.")
    request_timeout_s: Annotated[float, Field(gt=0)] = Field(default=300.0, description="Seconds one request may "
                                                             "take.")
    server: ServerOptions = Field(default=ServerOptions(), description="How kvlab launches a vllm or sglang server "
                                  "([backend.server]).")

    @field_validator("api_key_env")
    @classmethod
    def _check_key_var(cls, name: str, info: ValidationInfo) -> str:
        """Only a ``<NAME>_API_KEY`` variable is ever read as a key (:func:`kvlab.core.key_vars.key_var_problem`), so
        that no spec, from any front end, has kvlab send ``HOME`` or ``KVLAB_DATABASE_URL``.  A spec the store
        holds (an older kvlab validated it) is read back as it is: the engine refuses it before sending
        anything, and queued again it is validated as a new one."""
        if (problem := key_var_problem(name)) and not (info.context and info.context.get(STORED)):
            raise ValueError(problem)
        return name

    @model_validator(mode="after")
    def _check(self) -> BackendSpec:
        backend = BACKENDS[self.kind]
        if backend.loads_model_here and (self.base_url or self.model_id):
            *others, last = (name for name, b in BACKENDS.items() if "model_id" in b.fields)
            raise ValueError(f"base_url and model_id are for backend kinds {', '.join(others)} and {last}; "
                             f"the {self.kind} engine runs `model` in this process")
        if backend.launches_server and self.base_url:
            raise ValueError(f"backend {self.kind}: kvlab launches the server itself, so base_url is not used; "
                             "to use a server that is already running, set kind = 'openai_compat' and base_url")
        return self


class Resources(BaseModel):
    """What each worker of the experiment holds on a Ray node (``kvlab run --executor ray``; plain
    workers ignore it).  ``num_gpus`` None: 1 for vllm/sglang or device cuda, else 0."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    num_cpus: Annotated[float, Field(gt=0, le=1024)] = Field(default=1.0, description="CPUs each Ray worker "
                                                             "holds.")
    num_gpus: Annotated[float, Field(ge=0, le=64)] | None = Field(
        default=None, description="GPUs each Ray worker holds; unset: 1 for vllm/sglang or device cuda, else 0.")


def _margin(name: str) -> Any:
    """A margin's type: a finite number within its declared bounds."""
    return Annotated[float, Field(allow_inf_nan=False, **MARGIN_INPUTS[name].bounds)]


class ExperimentSpec(BaseModel):
    """A whole experiment: one model and backend, a task suite, and the configs to compare."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(default="experiment", description="The experiment's name in the store and the dashboard.")
    model: str = Field(default="smollm2-135m", description="A model registry name (`kvlab models list`), a local "
                       "Hugging Face directory or a .gguf file.")
    # the database stores it as a 64-bit integer
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = Field(default=0, description="Seeds the task generators and "
                                                            "every seeded method: the same seed, the same items.")
    backend: BackendSpec = Field(default=BackendSpec(), description="Where the model runs ([backend]).")
    tasks: list[TaskSpec] = Field(min_length=1, description="The task suite ([[tasks]]): every config runs on "
                                  "every item.")
    configs: list[KVCacheConfig] = Field(default=[], description="KV-cache configs ([[configs]]); the baseline "
                                         "(no quantization, no eviction) is always added first.")
    sweep: SweepGrid | None = Field(default=None, description="A grid expanded into more configs ([sweep]).")
    load: LoadSpec | None = Field(
        default=None, description="A load phase ([load]): after its items, each config's server is measured under "
        "load with the task's prompts, every config in the same KV memory budget (vllm, sglang, an endpoint).")
    tune: TuneSpec | None = Field(
        default=None, description="What `kvlab tune` searches ([tune]); configs and sweep then add fixed "
        "candidates.")
    max_context_length: Annotated[int, Field(ge=128)] | None = Field(
        default=None, description="Refuse context lengths above this (the model's own limit applies too).")
    # The sweet-spot rule's margins: bounds, default and help declared in kvlab.core.margin_inputs.
    max_drop: _margin("max_drop") = Field(  # type: ignore[valid-type]
        default=MARGIN_INPUTS["max_drop"].default, description=MARGIN_INPUTS["max_drop"].help)
    max_kl: _margin("max_kl") = Field(  # type: ignore[valid-type]
        default=MARGIN_INPUTS["max_kl"].default, description=MARGIN_INPUTS["max_kl"].help)
    min_agreement: _margin("min_agreement") = Field(  # type: ignore[valid-type]
        default=MARGIN_INPUTS["min_agreement"].default, description=MARGIN_INPUTS["min_agreement"].help)
    tags: list[str] = Field(default=[], description="Labels to find the experiment by (kvlab ls --tag).")
    notes: str = Field(default="", description="Free text shown with the experiment.")
    resources: Resources | None = Field(default=None, description="What each Ray worker holds ([resources]; "
                                        "`kvlab run --executor ray`); unset: its defaults.")

    @model_validator(mode="before")
    @classmethod
    def _count_entries(cls, data: Any) -> Any:
        """A spec of thousands of [[configs]] or [[tasks]] entries is refused before they are validated
        one by one (which takes seconds)."""
        for key, bound in (("configs", CONFIGS), ("tasks", TASKS)):
            entries = data.get(key) if isinstance(data, dict) else None
            if isinstance(entries, list):
                bound.check(key, len(entries), f"{{n}} [[{key}]] entries")
        return data

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if not name.strip():
            raise ValueError("give the experiment a name (it is how `kvlab ls` and the dashboard list it)")
        return check_text(name)

    @field_validator("model")
    @classmethod
    def _check_model(cls, model: str) -> str:
        return check_text(model, MAX_PATH_CHARS)

    @field_validator("tags")
    @classmethod
    def _check_tags(cls, tags: list[str]) -> list[str]:
        if len(tags) > MAX_TAGS:
            raise ValueError(f"{len(tags):,} tags; at most {MAX_TAGS}")
        for index, tag in enumerate(tags):
            try:
                check_text(tag, MAX_TAG_CHARS)
            except ValueError as problem:
                raise FieldProblem(str(index), str(problem)) from None
        return tags

    @field_validator("notes")
    @classmethod
    def _check_notes(cls, notes: str) -> str:
        return check_text(notes, MAX_NOTES_CHARS, allowed="\n\t")

    @model_validator(mode="after")
    def _check(self) -> ExperimentSpec:
        if not self.configs and self.sweep is None and self.tune is None:
            raise ValueError("give at least one [[configs]] entry, a [sweep] grid or a [tune] search space")
        if self.tune is not None:
            backend_space(self.tune, self.backend.kind)  # raises for a backend with nothing to tune
            unscored = [index for index, task in enumerate(self.tasks) if TASK_REGISTRY[task.name].scorer is None]
            if unscored:
                scored = ", ".join(name for name, task in TASK_REGISTRY.items() if task.scorer is not None)
                raise FieldProblem(f"tasks.{unscored[0]}.name", "kvlab tune decides on accuracy (scored items); "
                                   f"this task has no score: tune on a scored task ({scored})")
        for index, task in enumerate(self.tasks):
            # a file's items are bounded by its own limits (KVLAB_MAX_JSONL_ITEMS)
            if not TASK_REGISTRY[task.name].reads_file:
                ITEMS.check(f"tasks.{index}.num_items", task.items_per_length, "{n} items")
        check_context_lengths(self, context_limit(self.model))
        self._check_skip_layers()
        if self.sweep is not None:  # counted before it is expanded: a grid of millions is refused at once
            if self.sweep.quant == ["none"] and self.sweep.evict == ["none"]:
                raise FieldProblem("sweep", "the grid holds only the baseline (quant = ['none'], evict = ['none']), "
                                            "which always runs: add a format to quant or an eviction method to evict")
            CONFIGS.check("sweep", self.sweep.size(), "the [sweep] grid expands to {n} configs")
        configs = self.all_configs()
        CONFIGS.check("configs", len(configs), "{n} configs (the baseline, [[configs]] and the [sweep] grid)")
        labels = Counter(c.label for c in configs)
        duplicates = sorted(label for label, count in labels.items() if count > 1)
        if duplicates:
            raise ValueError(f"duplicate config names {duplicates}: give each [[configs]] entry a distinct name")
        conversations = [index for index, task in enumerate(self.tasks) if task.multi_turn]
        if conversations and self.backend.kind != "embedded":
            raise FieldProblem(f"tasks.{conversations[0]}.multi_turn",
                               f"a conversation (each question after the previous answer) runs on the embedded "
                               f"engine; a {self.backend.kind} backend would answer each question apart: use "
                               "backend kind 'embedded' or leave multi_turn off")
        aware = [c.label for c in configs if c.query_aware]
        shared = [index for index, task in enumerate(self.tasks) if task.questions_per_context > 1]
        if aware and shared:
            raise FieldProblem(f"tasks.{shared[0]}.questions_per_context",
                               f"{aware[0]} is query-aware (the question in its prefill), and a context shared by "
                               "several questions is compressed once, before any of them: drop query_aware or ask "
                               "one question per context")
        decoding = [c.label for c in configs if c.decode is not None]
        fed = [index for index, task in enumerate(self.tasks) if TASK_REGISTRY[task.name].kind == "perplexity"]
        if decoding and fed:
            raise FieldProblem(f"tasks.{fed[0]}.name", f"{decoding[0]} compresses during generation, and the "
                               f"{self.tasks[fed[0]].name} task generates nothing (its continuation is fed and "
                               "scored at once): run decode policies on a task that generates its answer")
        check_item_evals(self, known_items)
        self.check_load()
        return self

    def check_load(self) -> None:
        """A ``[load]`` table on a backend that batches requests, its budget where kvlab launches the server
        (:class:`FieldProblem` otherwise; also for a spec moved to another backend, ``kvlab run --backend``)."""
        load = self.load
        if load is None:
            return
        backend = BACKENDS[self.backend.kind]
        if backend.no_load:
            raise FieldProblem("load", backend.no_load)
        server = self.backend.server
        if backend.launches_server:
            if load.kv_budget_mib is None:
                raise FieldProblem("load.kv_budget_mib", f"give the KV memory every config's {backend.title} server "
                                   "gets (MiB): the same budget for every config is what the load compares")
            for name in backend.pool_settings:
                if getattr(server, name) is not None:
                    raise FieldProblem(f"backend.server.{name}", "load.kv_budget_mib sizes every config's KV pool: "
                                       f"remove server.{name}")
        elif load.kv_budget_mib is not None:
            raise FieldProblem("load.kv_budget_mib", "an endpoint sized its own KV pool when it was started: "
                                                     "remove load.kv_budget_mib")

    @property
    def margins(self) -> Margins:
        """The sweet-spot rule's margins."""
        return Margins(self.max_drop, self.max_kl, self.min_agreement)

    def _check_skip_layers(self) -> None:
        """16-bit layer patterns against the registry model's depth: a layer it lacks, or every layer."""
        depth = model_depth(self.model)
        if depth is None:
            return
        patterns = [(f"configs.{i}.skip_layers", c.skip_layers) for i, c in enumerate(self.configs) if c.skip_layers]
        for grid, name in ((self.sweep, "sweep"), (self.tune, "tune")):
            patterns += [(f"{name}.skip_layers.{i}", p) for i, p in enumerate(grid.skip_layers if grid else [])]
        for path, pattern in patterns:
            if why := pattern.check(depth):
                raise FieldProblem(path, f"{why} ({self.model})")

    def all_configs(self) -> list[KVCacheConfig]:
        """Explicit configs then the sweep grid, deduplicated, with the baseline first.

        The baseline (no quantization, no eviction) is always run: every result is judged
        against it, and it tells whether the model can do the task at all.
        """
        seen: dict[KVCacheConfig, None] = {}
        for config in [*self.configs, *(self.sweep.expand() if self.sweep else [])]:
            seen.setdefault(config, None)
        configs = list(seen)
        baselines = [c for c in configs if c.is_baseline]
        others = [c for c in configs if not c.is_baseline]
        return (baselines[:1] or [BASELINE]) + others


def known_items(task: TaskSpec) -> int | None:
    """Items ``task`` generates, as far as the spec alone tells: a jsonl file's count needs the file."""
    if TASK_REGISTRY[task.name].reads_file:
        return None
    return task.items_per_length * len(task.context_lengths) * task.questions_per_context


def check_item_evals(spec: ExperimentSpec, items_of: Callable[[TaskSpec], int | None]) -> None:
    """Refuse more item evaluations (items x configs) than :data:`kvlab.core.limits.ITEM_EVALS` allows;
    ``items_of`` counts a task's items (None: unknown, left out).  Validation counts what the spec
    says (:func:`known_items`); the submit path counts jsonl files too (``kvlab.tasks.planned_items``)."""
    items = sum(n for n in map(items_of, spec.tasks) if n is not None)
    configs = len(spec.all_configs())
    ITEM_EVALS.check("tasks", items * configs, f"{{n}} item evaluations ({items:,} items x {configs:,} configs)")


def check_context_lengths(spec: ExperimentSpec, model_limit: int | None) -> None:
    """Refuse context lengths longer than the spec's ``max_context_length`` or than the model takes
    (``model_limit``: its positions, None when not known here).  A launched server (vLLM, SGLang)
    serves ``model`` itself; an OpenAI-compatible endpoint serves a model of its own, whose limit
    only the endpoint knows."""
    # (limit, what it is, the remedy, whether the new tokens count: the model's positions hold them too)
    limits = [(spec.max_context_length, "max_context_length = {limit:,}", "", False)]
    if BACKENDS[spec.backend.kind].serves_spec_model:
        limits.append((model_limit, "{model}'s maximum context of {limit:,} tokens",
                       " or a model with a longer context", True))
    if BACKENDS[spec.backend.kind].launches_server:  # the launched server's context (llama.cpp: its pool's cells)
        limits.append((spec.backend.server.max_model_len, "server.max_model_len = {limit:,}",
                       " or a larger server.max_model_len", True))
    for index, task in enumerate(spec.tasks):
        # its prompts are measured once tokenized (the engine refuses one too long)
        if not TASK_REGISTRY[task.name].target_lengths:
            continue
        new_tokens = task.max_new_tokens or TASK_REGISTRY[task.name].default_new_tokens or 1
        for limit, what, remedy, with_new in limits:
            if limit is None:
                continue
            too_long = [n for n in task.context_lengths if n + (new_tokens if with_new else 0) > limit]
            if too_long:
                exceeded = what.format(limit=limit, model=spec.model)  # the template is ours, the model is a value
                also = f" with {new_tokens} new tokens" if with_new else ""
                raise FieldProblem(f"tasks.{index}.context_lengths",
                                   f"{too_long} exceed {exceeded}{also}: the prompt and its new tokens must fit; "
                                   f"use shorter context lengths{remedy}")


def format_validation_error(error: ValidationError) -> str:
    """One line per problem, each naming the field path, e.g. ``configs.2.quant: Input should be ...``
    (a whole-spec check names its field with :class:`kvlab.core.limits.FieldProblem`)."""
    lines = []
    for problem in error.errors():
        path = ".".join(str(p) for p in problem["loc"])
        cause = problem.get("ctx", {}).get("error")
        if isinstance(cause, FieldProblem):
            path = ".".join(p for p in (path, cause.path) if p)
        path = path or "spec"
        message = problem["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {message}")
    return "\n".join(lines)


def refuse_credentials(data: Any, path: str = "") -> None:
    """Raise :class:`ConfigError` naming the first field that holds a URL with credentials.

    A stored spec never holds a secret: a ``user:password@`` in ``backend.base_url`` or
    ``backend.server.host`` (any ``@`` counts, so that no piece of a password with an unescaped
    ``@`` or ``/`` survives) or in a URL anywhere else in the spec is refused rather than
    stripped, so that nothing runs with an authentication the user did not expect.  The message
    never repeats the value.
    """
    if isinstance(data, dict):
        for key, value in data.items():
            refuse_credentials(value, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            refuse_credentials(value, f"{path}.{index}")
    elif isinstance(data, str):
        if path.endswith(("base_url", "server.host")) and url_credentials(data) is not None:
            raise ConfigError(
                f"{path}: holds credentials (user:password@ or an '@'), which kvlab never stores or sends; "
                "remove them, and put the API key in the variable named by backend.api_key_env (KVLAB_API_KEY by "
                "default) in the environment or .streamlit/secrets.toml: kvlab sends it as a Bearer token")
        if URL_USERINFO.search(data):
            raise ConfigError(f"{path}: holds a URL with credentials (scheme://user:password@host), which kvlab "
                              "never stores; remove the user:password@ part")


def parse_spec(data: dict[str, Any], stored: bool = False) -> ExperimentSpec:
    """Validate a spec dict, raising :class:`ConfigError` with a readable message (a URL with
    credentials anywhere in it is refused: :func:`refuse_credentials`).  ``stored``: the spec is one the
    store holds (kvlab wrote it; what an older kvlab wrote that this one reads no more is dropped:
    :data:`kvlab.core.tasks.LEGACY_DEFAULTS`)."""
    refuse_credentials(data)
    try:
        return ExperimentSpec.model_validate(data, context={STORED: True} if stored else None)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error)) from None



def spec_text(data: bytes, source: str) -> str:
    """The text of a spec file's bytes (UTF-8, with or without a byte-order mark), at most 1 MiB."""
    if len(data) > MAX_SPEC_BYTES:
        raise ConfigError(f"{source}: {len(data):,} bytes; a spec file is at most {MAX_SPEC_BYTES:,} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{source}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); "
                          "save the spec as UTF-8") from None



def spec_to_dict(spec: ExperimentSpec) -> dict[str, Any]:
    """A TOML-ready dict (None values dropped: TOML has no null)."""
    return _drop_none(spec.model_dump(mode="json"))


def dump_spec(spec: ExperimentSpec) -> str:
    return tomli_w.dumps(spec_to_dict(spec))


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value
