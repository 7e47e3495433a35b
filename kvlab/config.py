"""Experiment configuration: pydantic models, sweep expansion and TOML in/out.

Terms (see DESIGN.md): ``ratio`` in an eviction config is kvpress's
``compression_ratio`` -- the *fraction of context tokens removed*.  The
*compression ratio* reported in results is ``baseline bytes / physical bytes``
(``kvlab.compress.accounting``).  The two are never mixed.
"""

from __future__ import annotations

import tomllib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvlab.backends import BACKEND_NAMES, BACKENDS
from kvlab.compress.formats import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_RESIDUAL_LENGTH,
    FORMATS,
    GROUP_SIZES,
    KEY_AXES,
    MAX_RESIDUAL_LENGTH,
    QUANT_NAMES,
)
from kvlab.compress.methods import BUDGET_BOUNDS, BUDGETS, METHOD_NAMES, METHODS, PARAMS, methods_with
from kvlab.errors import ConfigError
from kvlab.experiments.decision import DEFAULT_MAX_KL, Margins
from kvlab.limits import (
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
from kvlab.models.registry import context_limit
from kvlab.secrets import URL_USERINFO, url_credentials
from kvlab.space import ConfigSpace, canonical_name, canonical_names
from kvlab.tasks import TASKS as TASK_REGISTRY, planned_items
from kvlab.tasks.jsonl import check_task_files
from kvlab.tasks.spec import MAX_PATH_CHARS, TaskSpec
from kvlab.tune.spec import TuneSpec, backend_space

QuantDtype = Literal[QUANT_NAMES]  # type: ignore[valid-type]  # the format registry's names
EvictionMethod = Literal[METHOD_NAMES]  # type: ignore[valid-type]  # "none" + the method registry's names
GroupSize = Literal[GROUP_SIZES]  # type: ignore[valid-type]
KeyAxis = Literal[KEY_AXES]  # type: ignore[valid-type]
ResidualLength = Annotated[int, Field(ge=0, le=MAX_RESIDUAL_LENGTH)]
BackendKind = Literal[BACKEND_NAMES]  # type: ignore[valid-type]  # the backend registry's names

QUANT_DTYPES: tuple[str, ...] = QUANT_NAMES
EVICTION_METHODS: tuple[str, ...] = METHOD_NAMES

#: A spec is a few KB; anything near this is not a spec (and would be read whole into memory).
MAX_SPEC_BYTES = 1 << 20

Fraction = Annotated[float, Field(gt=BUDGET_BOUNDS[0], lt=BUDGET_BOUNDS[1])]


def _param(name: str) -> Any:
    param = PARAMS[name]
    return Annotated[int, Field(ge=param.low, le=param.high)]


class KVCacheConfig(BaseModel):
    """One KV-cache configuration: quantization of what is kept, after optional token eviction.

    Quantization (``quant``): integer codes of ``int8/int4/int2`` are packed into bytes with a
    scale and zero point per group (KIVI: keys grouped per channel along ``group_size`` tokens,
    values per token along ``group_size`` channels), the last ``residual_length`` tokens stay
    16-bit.  ``fp8_*`` stores one byte per element with a scale per head and block of
    ``group_size`` tokens, and keeps the residual too.  The settings a format reads are its
    registry entry's ``settings`` (:mod:`kvlab.compress.formats`); the others are left unused.

    Eviction (``evict``): a kvpress scorer ranks context tokens per head; exactly one budget of
    the budget registry (:data:`kvlab.compress.methods.BUDGETS`) is given: ``ratio`` (fraction
    removed, kvpress's ``compression_ratio``), ``keep_fraction`` (top-k: fraction kept) or
    ``threshold`` (evict tokens whose normalised score falls below this quantile of all scores of
    the model, so layers may keep different counts).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = ""
    quant: QuantDtype = "none"
    group_size: GroupSize = DEFAULT_GROUP_SIZE
    residual_length: ResidualLength = DEFAULT_RESIDUAL_LENGTH
    key_axis: KeyAxis = KEY_AXES[0]
    evict: EvictionMethod = "none"
    # The budget registry's kinds (kvlab.compress.methods.BUDGETS), one field each:
    ratio: Fraction | None = None
    keep_fraction: Fraction | None = None
    threshold: Fraction | None = None
    query_aware: bool = False
    window_size: _param("window_size") = PARAMS["window_size"].default  # type: ignore[valid-type]
    n_sink: _param("n_sink") = PARAMS["n_sink"].default  # type: ignore[valid-type]

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        return check_text(name)

    @field_validator("quant", "evict", mode="before")
    @classmethod
    def _canonical_name(cls, value: Any) -> Any:
        return canonical_name(value)

    @model_validator(mode="after")
    def _check_budget(self) -> KVCacheConfig:
        budgets = self.budgets_given
        if self.evict == "none":
            if budgets:
                raise ValueError(
                    f"{', '.join(budgets)} given but evict = 'none'; choose an eviction method "
                    f"({', '.join(EVICTION_METHODS[1:])}) or drop the budget"
                )
            if self.query_aware:
                raise ValueError("query_aware = true needs an eviction method (evict)")
        else:
            accepted = METHODS[self.evict].budgets
            if len(budgets) != 1:
                raise ValueError(
                    f"evict = '{self.evict}' needs exactly one budget: "
                    f"{'; '.join(f'{b} ({BUDGETS[b].help})' for b in accepted)}; got {', '.join(budgets) or 'none'}"
                )
            budget = next(iter(budgets))
            if budget not in accepted:
                raise ValueError(
                    f"{budget} works with {', '.join(methods_with(budget))}, not '{self.evict}' "
                    f"(its budgets: {', '.join(accepted)})"
                )
        return self

    @property
    def budgets_given(self) -> dict[str, float]:
        """The budget fields that are set, by kind (validation allows one, and only with a method)."""
        return {name: value for name in BUDGETS if (value := getattr(self, name)) is not None}

    @property
    def is_baseline(self) -> bool:
        return self.quant == "none" and self.evict == "none"

    @property
    def removed_fraction(self) -> float | None:
        """Fraction of context tokens to remove per head, or None (none / threshold: decided by scores)."""
        if self.ratio is not None:
            return self.ratio
        if self.keep_fraction is not None:
            return 1.0 - self.keep_fraction
        return None

    @property
    def label(self) -> str:
        """The config's name, or a readable one derived from its settings."""
        return self.name or describe(self)


def describe(config: KVCacheConfig) -> str:
    """A short, unique-enough label such as ``int4/g64/r64+snapkv:r0.75``: the format with the settings
    its registry entry labels, the method with its budget (the budget registry's prefix)."""
    parts = []
    if config.quant != "none":
        settings = FORMATS[config.quant].settings
        parts.append(config.quant + "".join(s.label(getattr(config, s.field)) for s in settings))
    if config.evict != "none":
        budget = "".join(f"{BUDGETS[name].label}{value:g}" for name, value in config.budgets_given.items())
        parts.append(f"{config.evict}:{budget}" + ("/qa" if config.query_aware else ""))
    return "+".join(parts) or "baseline"


BASELINE = KVCacheConfig(name="baseline")


class SweepGrid(BaseModel):
    """A grid over quantization x eviction method x ratio, expanded into configs (:meth:`space`).

    Each list holds at least one value and none twice, so the grid's points are distinct and
    :meth:`size` counts them without expanding it.  ``group_size`` and ``residual_length`` go to
    the formats that read them (the format registry's ``settings``).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    quant: list[QuantDtype] = Field(default=["none"], min_length=1)
    evict: list[EvictionMethod] = Field(default=["none"], min_length=1)
    ratios: list[Fraction] = Field(default=[0.5], min_length=1)
    group_size: GroupSize = DEFAULT_GROUP_SIZE
    residual_length: ResidualLength = DEFAULT_RESIDUAL_LENGTH
    query_aware: bool = False

    @field_validator("quant", "evict", mode="before")
    @classmethod
    def _canonical_names(cls, value: Any) -> Any:
        return canonical_names(value)

    @field_validator("quant", "evict", "ratios")
    @classmethod
    def _distinct(cls, values: list[Any]) -> list[Any]:
        twice = [str(value) for value, count in Counter(values).items() if count > 1]
        if twice:
            raise ValueError(f"lists {', '.join(twice)} twice: give each value once")
        return values

    def space(self) -> ConfigSpace:
        """The grid as a config space: ``ratios`` are the budget kind ``ratio``; the baseline is one of its points."""
        return ConfigSpace(quant=tuple(self.quant), evict=tuple(self.evict), budget="ratio", budgets=tuple(self.ratios),
                           settings={"group_size": (self.group_size,), "residual_length": (self.residual_length,)},
                           query_aware=self.query_aware, with_baseline=True)

    def size(self) -> int:
        """Configs :meth:`expand` makes, counted (a method ``none`` takes no ratio)."""
        return self.space().size()

    def expand(self) -> list[KVCacheConfig]:
        return [KVCacheConfig(**point) for point in self.space().points()]


class ServerOptions(BaseModel):
    """How kvlab launches a vLLM or SGLang server (backends ``vllm`` and ``sglang`` only).

    Each maps to one real flag (see ``kvlab.engines.server_flags``): ``memory_fraction`` is
    vLLM's ``--gpu-memory-utilization`` and SGLang's ``--mem-fraction-static``;
    ``max_model_len`` is ``--max-model-len`` / ``--context-length``; ``prefix_cache = false``
    is ``--no-enable-prefix-caching`` / ``--disable-radix-cache``.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    python: str = "python"  # the interpreter that has vllm / sglang installed
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 0  # 0: pick a free port
    memory_fraction: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    max_model_len: Annotated[int, Field(ge=128)] | None = None
    prefix_cache: bool = True
    startup_timeout_s: Annotated[float, Field(gt=0)] = 900.0
    extra_args: list[str] = []


class BackendSpec(BaseModel):
    """Where the model runs.

    Secrets never live here: ``api_key_env`` names the environment variable (or the key of
    ``.streamlit/secrets.toml``) that holds the key, and a ``base_url`` with ``user:password@``
    is refused (:func:`refuse_credentials`).  ``base_url`` and ``model_id`` of an
    ``openai_compat`` backend may also come from ``KVLAB_BASE_URL`` / ``KVLAB_MODEL_ID``.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: BackendKind = "embedded"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    base_url: str | None = None
    model_id: str | None = None
    api_key_env: str = "KVLAB_API_KEY"
    max_concurrency: Annotated[int, Field(ge=1, le=256)] = 4
    max_retries: Annotated[int, Field(ge=0, le=20)] = 3
    request_timeout_s: Annotated[float, Field(gt=0)] = 300.0
    server: ServerOptions = ServerOptions()

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

    num_cpus: Annotated[float, Field(gt=0, le=1024)] = 1.0
    num_gpus: Annotated[float, Field(ge=0, le=64)] | None = None


class ExperimentSpec(BaseModel):
    """A whole experiment: one model and backend, a task suite, and the configs to compare."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = "experiment"
    model: str = "smollm2-135m"
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0  # the database stores it as a 64-bit integer
    backend: BackendSpec = BackendSpec()
    tasks: list[TaskSpec] = Field(min_length=1)
    configs: list[KVCacheConfig] = []
    sweep: SweepGrid | None = None
    tune: TuneSpec | None = None  # `kvlab tune`: the search space (configs/sweep then add fixed candidates)
    max_context_length: Annotated[int, Field(ge=128)] | None = None
    # The sweet spot's non-inferiority margin: the accuracy a config may lose against the baseline
    # (0.05 = 5 points), decided by a paired test with Holm's correction (kvlab.experiments.decision).
    max_drop: Annotated[float, Field(gt=0, le=0.5, allow_inf_nan=False)] = 0.05
    # Fidelity margins (kvlab.experiments.verdict): a config whose teacher-forced mean KL against the
    # baseline is certified below max_kl nats per token (and/or top-1 agreement above min_agreement)
    # is acceptable unless its accuracy is shown to drop by more than max_drop.  0 turns one off.
    max_kl: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)] = DEFAULT_MAX_KL
    min_agreement: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0
    tags: list[str] = []
    notes: str = ""
    resources: Resources | None = None  # for the Ray executor; None: its defaults

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
            if not TASK_REGISTRY[task.name].reads_file:  # a file's items are bounded by its own limits (KVLAB_MAX_JSONL_ITEMS)
                ITEMS.check(f"tasks.{index}.num_items", task.items_per_length, "{n} items")
        check_context_lengths(self, context_limit(self.model))
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
        check_item_evals(self, known_items)
        return self

    @property
    def margins(self) -> Margins:
        """The sweet-spot rule's margins."""
        return Margins(self.max_drop, self.max_kl, self.min_agreement)

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
    return None if TASK_REGISTRY[task.name].reads_file else task.items_per_length * len(task.context_lengths)


def check_item_evals(spec: ExperimentSpec, items_of: Callable[[TaskSpec], int | None]) -> None:
    """Refuse more item evaluations (items x configs) than :data:`kvlab.limits.ITEM_EVALS` allows;
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
    limits = [(spec.max_context_length, "max_context_length = {limit:,}", "")]
    if BACKENDS[spec.backend.kind].serves_spec_model:
        limits.append((model_limit, "{model}'s maximum context of {limit:,} tokens",
                       " or a model with a longer context"))
    for index, task in enumerate(spec.tasks):
        if not TASK_REGISTRY[task.name].target_lengths:  # its prompts are measured once tokenized (the engine refuses one too long)
            continue
        for limit, what, remedy in limits:
            too_long = [n for n in task.context_lengths if limit is not None and n > limit]
            if limit is not None and too_long:
                exceeded = what.format(limit=limit, model=spec.model)  # the template is ours, the model is a value
                raise FieldProblem(f"tasks.{index}.context_lengths",
                                   f"{too_long} exceed {exceeded}: the prompt and its new tokens must fit; "
                                   f"use shorter context lengths{remedy}")


def check_on_this_host(spec: ExperimentSpec) -> None:
    """What validation cannot tell from the spec alone, checked before anything is stored or loaded
    (:func:`load_spec`, and the submit path of every front end): context lengths against a local
    model directory's limit (validation knows the registry's), and the item evaluations with each
    jsonl file's records counted."""
    try:
        check_context_lengths(spec, context_limit(spec.model, read_files=True))
        check_item_evals(spec, planned_items)
    except FieldProblem as problem:
        raise ConfigError(f"{problem.path}: {problem}") from None


def format_validation_error(error: ValidationError) -> str:
    """One line per problem, each naming the field path, e.g. ``configs.2.quant: Input should be ...``
    (a whole-spec check names its field with :class:`kvlab.limits.FieldProblem`)."""
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


def parse_spec(data: dict[str, Any]) -> ExperimentSpec:
    """Validate a spec dict, raising :class:`ConfigError` with a readable message (a URL with
    credentials anywhere in it is refused: :func:`refuse_credentials`)."""
    refuse_credentials(data)
    try:
        return ExperimentSpec.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error)) from None


def parse_spec_toml(text: str, source: str = "spec") -> tuple[ExperimentSpec, list[str]]:
    """A spec from TOML text (native or seed-blog shaped) and any warnings.  Every error message
    starts with ``source`` (the file's name) and names the line and column or the field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML: {error}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(f"{source}: not valid TOML: arrays or tables nested too deeply") from None
    from kvlab.seed_format import is_seed_style, translate_seed_spec

    try:
        if is_seed_style(data):
            data, warnings = translate_seed_spec(data)
            return parse_spec(data), warnings
        return parse_spec(data), []
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None


def spec_text(data: bytes, source: str) -> str:
    """The text of a spec file's bytes (UTF-8, with or without a byte-order mark), at most 1 MiB."""
    if len(data) > MAX_SPEC_BYTES:
        raise ConfigError(f"{source}: {len(data):,} bytes; a spec file is at most {MAX_SPEC_BYTES:,} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{source}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); "
                          "save the spec as UTF-8") from None


def load_spec(path: str | Path) -> tuple[ExperimentSpec, list[str]]:
    """Read a TOML spec file (native or seed-blog shaped) and return it with any warnings; jsonl
    task files are validated too, and their paths made absolute (:func:`check_task_files`), and
    what this host's files tell checked (:func:`check_on_this_host`)."""
    path = Path(path)
    try:
        if path.is_dir():
            raise ConfigError(f"{path}: is a directory; give a spec TOML file (examples/ has some)")
        if path.exists() and not path.is_file():
            raise ConfigError(f"{path}: not a regular file; give a spec TOML file")
        size = path.stat().st_size
        if size > MAX_SPEC_BYTES:  # before reading: the path may name a huge file
            raise ConfigError(f"{path}: {size:,} bytes; a spec file is at most {MAX_SPEC_BYTES:,} bytes")
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: spec file not found") from None
    except PermissionError:
        raise ConfigError(f"{path}: not readable by this user (permission denied)") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot be read ({error.strerror or error})") from None
    spec, warnings = parse_spec_toml(spec_text(data, str(path)), str(path))
    spec = check_task_files(spec)  # a bad task file is refused before any model loads
    try:
        check_on_this_host(spec)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    return spec, warnings


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
