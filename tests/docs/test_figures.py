"""Every figure the documentation quotes has one source.  A quantity stated on several pages (a duration, an
item count, a measured ratio, a default) is stated at its *home* and linked from the other pages, or, where
repeating it helps (a default the code defines), stated with one value everywhere.

``QUANTITIES`` is the table of the quantities the docs state: a name, the patterns that find a statement of it
(each group of a match is a part of its value), and optionally its home pages and the code that defines it.
:func:`check` reads (page, text) pairs -- README.md, docs/**/*.md and the comments of examples/*.toml, as
:func:`pages` collects them -- and returns, naming pages and values, every quantity stated with two different
values and every statement of a homed quantity outside its home.  Values are compared at the precision each
statement gives ("about 6 minutes" agrees with "6 min 2 s"; "about 96" does not with "about 109")."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README, TUTORIAL, DECISIONS, BENCHMARKS = "README.md", "docs/tutorial.md", "docs/decisions.md", "docs/benchmarks.md"


@dataclass(frozen=True)
class Quantity:
    """One quantity the docs state: ``patterns`` find its statements (case-insensitive, whitespace as one space);
    ``home``, when given, the only pages that may state it with a number; ``code``, ``"module:NAME"``, the value
    the code defines, which every statement must agree with."""

    name: str
    patterns: tuple[str, ...]
    home: tuple[str, ...] = ()
    code: str | None = None
    regexes: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regexes", tuple(re.compile(p, re.IGNORECASE) for p in self.patterns))


def Q(name: str, *patterns: str, home: str | tuple[str, ...] = (), code: str | None = None) -> Quantity:
    """A row of the table: a :class:`Quantity` with its patterns as arguments and one home page as a string."""
    return Quantity(name, patterns, (home,) if isinstance(home, str) else home, code)


def _cli_default(option: str) -> str:
    """The default column of an option's row in the generated CLI reference (the code's own default)."""
    return rf"`{re.escape(option)} {option.lstrip('-').replace('-', '_')}` \| \| `([\d.]+)`"


#: The quantities the docs state.  A home is where the figure lives; the README's first 30 lines state the suite's
#: and the tutorial's times, so those quantities are at home there too.
QUANTITIES: tuple[Quantity, ...] = (
    # durations: the suite, its fast tier, installs and builds
    Q("the whole suite's time", r"whole suite takes (about [\w ]+?) on \d cpu cores", r"\b([\d,]+ s) of tests\b",
      home=README),
    Q("the test command's time", r"the test command ([\d,]+ s) in all", home=README),
    Q("the suite's count of tests", r"\b(\d{1,3},\d{3}) (?:of them|tests)\b", home=README),
    Q("the fast tier's time", r"--fast`[^.]*?\((\d[\d,]* s) measured",
      r"fast tier(?:'s time)? (?:took|takes|is) (?:about )?(\d[\d,]* s|\w+ minutes)\b",
      r"the fast tier's (\w+ minutes)", home=README),
    Q("llama.cpp's build", r"about (\d+ minutes) the first time to build llama\.cpp",
      r"(\d+ min(?: \d+ s)?) of compiling", home=("docs/howto/llamacpp.md", README)),
    Q("vLLM's install time", r"\(measured: (\d+ min \d+ s)\)", r"measured: (\d+ min \d+ s), [\d.]+ GB",
      home="docs/howto/vllm-sglang.md"),
    Q("vLLM's install size", r"\b([\d.]+ GB) and \d+ min on 2 cores", r"its own venv, ~([\d.]+ GB)",
      r"measured: \d+ min \d+ s, ([\d.]+ GB)", home="docs/howto/vllm-sglang.md"),
    Q("a vLLM server's start-up on 2 cores", r"each server (?:is )?(?:healthy|starts) in ([^.;(]+?) ?[.;(]",
      home="docs/howto/vllm-sglang.md"),
    # durations: the tutorial and the examples
    Q("the tutorial's time", r"\((\d+ minutes) measured on 2 cores", r"; (\d+ min) in all\b", home=(TUTORIAL, README)),
    Q("the tutorial's span", r"(a quarter of an hour to half an hour)", home=TUTORIAL),
    Q("the tiny sweep's time", r"tiny sweep (\d+ s)\b", r"tiny\.toml` \([^)]*?(\d+ s) on",
      r"(about half a minute) on 2 (?:cpu )?cores", r"3-config sweep in (under a minute)", home=TUTORIAL),
    Q("quick.toml's time", r"\bquick (\d+ min \d+ s)", r"quick\.toml` is [^.]*?about (\d+ minutes)",
      r"quick sweep[^.]*?\(~?(\d+ minutes)", home=TUTORIAL),
    Q("shared_context.toml's time", r"shared_context\.toml`?:[^)]*?(\d+ min \d+ s)",
      r"measured on 2 cpu cores: (\d+ min \d+ s) \(\d+ questions", home="docs/concepts/engine.md"),
    Q("long_generation.toml's time", r"long_generation\.toml`?:[^)]*?(\d+ min \d+ s)",
      r"measured on 2 cpu cores: (\d+ min \d+ s) \(\d+ items x", home="docs/concepts/generation.md"),
    Q("llamacpp.toml's time", r"llamacpp\.toml`? ?[:(][^.]*?\b(\d[\d,]* s)\b", home=DECISIONS),
    # items a margin needs
    Q("the items the tiny example needs for a margin of 0.05", r"that takes about (\d+)\)",
      r"tiny example's \"rests on \d+ items; the margin of [\d.]+ needs about (\d+)", home=TUTORIAL),
    Q("the items quick.toml needs for a margin of 0.05 by accuracy", r"about (\d+) items when \d+ configs are compared",
      r"against about (\d+) by accuracy", r"accuracy alone would need about (\d+)", home="docs/concepts/decision.md"),
    Q("the items fidelity needs on quick.toml (int8, int4)", r"int8 (\d+), int4 (\d+) by mean kl",
      r"int8 is certified on (\d+) items and int4 on (\d+)", home="docs/concepts/decision.md"),
    # measured KL, speed ratios
    Q("quick.toml's mean KL of int8 and int4",
      r"mean KL(?: against the baseline)? \(?(\d(?:\.\d+)?e-\d+)(?: \(int8\))? and (\d\.\d+)",
      home="docs/concepts/decision.md"),
    Q("llamacpp.toml's q8_0 mean KL", r"q8_0\b[^;]{0,40}?\(?mean KL (\d\.\d+ \[[^\]]*\])", home=DECISIONS),
    Q("recall on SmolLM2 at 1K tokens (baseline, StreamingLLM, SnapKV)",
      r"baseline (0\.\d+), (?:int4 0\.\d+, )?StreamingLLM (?:at )?50% (0\.\d+), SnapKV (?:at )?50% (0\.\d+)",
      home="docs/howto/data.md"),
    Q("what fidelity costs a sweep", r"([\d.]+x) the sweep without (?:it|fidelity)", home="docs/concepts/decision.md"),
    Q("the batched sweep against separate runs, 1K and 2K tokens", r"(0\.\d+) and (0\.\d+) of the separate runs",
      r"batched / separate runs (0\.\d+) at 1K tokens and (0\.\d+) at 2K", home=BENCHMARKS),
    Q("kvlab against kvpress's pipeline per item-config",
      r"([\d.]+ s) per item-config against kvpress's pipeline's ([\d.]+ s)", home=BENCHMARKS),
    Q("the playground's warm Run", r"(?:warm|→) \*\*([\d.]+ s)\*\* \(median of 3", home=BENCHMARKS),
    Q("the playground's Runs beside a worker (the same item, a new item)",
      r"warm Run (\d\.\d+ s) for the same item again, (\d\.\d+ s) for a new item",
      r"the same item again \*\*(\d\.\d+ s)\*\*, a new item \*\*(\d\.\d+ s)\*\* \(", home=BENCHMARKS),
    Q("`kvlab run` beside stress / unloaded", r"`kvlab run` takes ([\d.]+x) its unloaded time",
      r"`kvlab run` [\d.]+x -> ([\d.]+x)", home="docs/concepts/store.md"),
    # bytes, byte ratios, the model
    Q("vLLM's bytes per token (auto, fp8)", r"([\d,]+) \(auto, bfloat16\) and ([\d,]+) \(fp8",
      r"measured ([\d,]+) and ([\d,]+) B/token against", home="docs/howto/vllm-sglang.md"),
    Q("llama.cpp q8_0's ratio", r"q8_0 at ([\d.]+x)", r"\| q8_0 \|[^|]*\|[^|]*\| ≈[\d,]+ \| ([\d.]+x) \|"),
    Q("SmolLM2's 16-bit bytes per token", r"16-bit ([\d,]+) B/token", r"([\d,]+) and [\d,]+ from the geometry",
      r"\(([\d,]+) B each\)"),
    Q("SmolLM2's geometry (layers, KV heads, head dim)", r"(\d+) layers, (\d+) KV heads, head[ _]dim (\d+)"),
    Q("SmolLM2's context", r"\((\d,\d{3}) on SmolLM2\)", r"model's own context \((\d,\d{3})\)"),
    Q("the tune example's grid", r"(\d+) configs as a (?:full )?grid"),
    Q("the tune example's item evaluations",
      r"([\d,]+) item evaluations (?:with the baseline|over passkey and recall)"),
    # defaults the code defines: every statement, the generated reference's rows included, has the code's value
    Q("the default max_drop", r"\| `max_drop` \| number \| `([\d.]+)`", r"`max_drop`\"? \(default ([\d.]+)",
      r"default: the (?:spec|experiment)'s max_drop, ([\d.]+)\)", code="kvlab.core.margins:DEFAULT_MAX_DROP"),
    Q("the default max_kl", r"\| `max_kl` \| number \| `([\d.]+)`", r"default `max_kl = ([\d.]+)`",
      r"default (?:fidelity )?margin(?: of|,) ([\d.]+) nats", r"default: the (?:spec|experiment)'s max_kl, ([\d.]+)\)",
      code="kvlab.core.margins:DEFAULT_MAX_KL"),
    Q("a worker's heartbeat", _cli_default("--heartbeat-s"), r"heartbeat every (\d+ s)", r"next heartbeat \((\d+ s)"),
    Q("a worker's stale timeout", _cli_default("--stale-after-s"), r"`--stale-after-s` \((\d+)\)",
      r"requeue its trials after (\d+ s)", r"`stale_after_s` \((\d+ s)\)"),
    Q("the configs a worker claims together", _cli_default("--max-trials"), r"`--max-trials`, default (\d+)"),
    Q("a worker's telemetry rate", _cli_default("--telemetry-hz"), r"\((\d+ Hz) default"),
    Q("a worker's backoff", _cli_default("--backoff-s"), r"`--backoff-s` \((\d+ s)\)"),
    Q("a worker's failures in a row", _cli_default("--max-failures"), r"`--max-failures` \((\d+)\)"),
    Q("the largest body `kvlab serve` reads", _cli_default("--max-body-mb"), r"`--max-body-mb` \(default (\d+ MiB)\)",
      r"bodies over (\d+ MiB)"),
    Q("the default alpha_safeguard", r"\| `alpha_safeguard` \| number \| `([\d.]+)`", r"`alpha_safeguard` \(([\d.]+)\)",
      r"alpha_safeguard = ([\d.]+) ", r"alpha_safeguard\) \(default ([\d.]+)\)"),
    Q("the items per context length when unset", r"items per context length; unset: (\d+)",
      r"per context length \(unset: (\d+);", r"`items_per_length` = (\d+)"),
    Q("the default passage_words", r"\| `passage_words` \| integer \| `(\d+)`", r"\(default (\d+) words\)"),
    Q("vLLM's CPU pool when unset", r"unset: (\d+) on vLLM's CPU build", r"`server\.kv_cache_gib`, default\s?(\d+ GiB)",
      r"default (\d+ GiB) there"),
)

_PAGES = ("README.md", "docs/**/*.md", "examples/*.toml")


def _text_of(path: Path) -> str:
    """What a page states in words: a Markdown page whole, a TOML spec's comments (line for line)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".toml":
        return "\n".join(line.partition("#")[2] for line in text.splitlines())
    return text


def pages(root: Path = ROOT) -> list[tuple[str, str]]:
    """The documentation under ``root`` as (page, text) pairs: README.md, docs/**/*.md, examples' comments."""
    paths = sorted({path for pattern in _PAGES for path in root.glob(pattern) if path.is_file()})
    return [(path.relative_to(root).as_posix(), _text_of(path)) for path in paths]


# --- values -----------------------------------------------------------------------------------------------------

_SECONDS = {"ms": 0.001, "s": 1, "min": 60, "minute": 60, "minutes": 60, "hour": 3600, "hours": 3600}
_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
          "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
_PHRASES = {"half a minute": (30.0, 30.0), "half an hour": (1800.0, 1800.0), "a quarter of an hour": (900.0, 900.0)}
_NUMBER = re.compile(r"(-?\d[\d,]*(?:\.(\d+))?)(?:e(-?\d+))?$", re.IGNORECASE)


@dataclass(frozen=True)
class Amount:
    """A number as a statement gives it: its value, its unit (seconds for every duration) and, for a rounded
    statement ("about 96", "half a minute", "29 minutes"), the precision its digits or words give: a value within
    half of it either way agrees.  Any other number is exact."""

    value: float
    unit: str = ""
    rounding: float = 0.0

    def agrees(self, other: Amount) -> bool:
        if self.unit and other.unit and self.unit != other.unit:
            return False
        return abs(self.value - other.value) <= max(self.rounding, other.rounding) / 2 + 1e-9 * abs(self.value)


def _number(text: str) -> tuple[float, float] | None:
    """A number in digits or a word, and the precision of its last digit."""
    if text in _WORDS:
        return float(_WORDS[text]), 1.0
    match = _NUMBER.match(text)
    if not match:
        return None
    scale = 10.0 ** int(match.group(3) or 0)
    return float(match.group(1).replace(",", "")) * scale, 10.0 ** -len(match.group(2) or "") * scale


def amount(text: str) -> Amount | str:
    """A stated value as an :class:`Amount` ("6 min 2 s", "about 6 minutes", "0.05", "1.14x", "2.5 GB"), or, when
    it is no single number (a range, an interval), its words, compared as they are."""
    words = re.sub(r"\s+", " ", text.strip().lower())
    exact = words
    words = re.sub(r"^(?:about|~|under) ?", "", words)
    if words in _PHRASES:
        return Amount(_PHRASES[words][0], "s", _PHRASES[words][1])
    compound = re.fullmatch(r"(\d+) min (\d+) s", words)
    if compound:
        return Amount(int(compound.group(1)) * 60.0 + int(compound.group(2)), "s", 0.0 if exact == words else 1.0)
    match = re.fullmatch(r"(\S+?) ?(ms|s|min|minutes?|hours?|x|%|hz|mib|gib|gb|mb|kb|b/token)?", words)
    number = _number(match.group(1)) if match else None
    if match is None or number is None:
        return words
    unit = match.group(2) or ""
    scale = _SECONDS.get(unit, 1.0)
    rounded = exact != words or match.group(1) in _WORDS or scale > 1  # "about", a word, whole minutes or hours
    return Amount(number[0] * scale, "s" if unit in _SECONDS else unit, number[1] * scale if rounded else 0.0)


def _agree(one: tuple[Amount | str, ...], other: tuple[Amount | str, ...]) -> bool:
    if len(one) != len(other):
        return False
    return all(a.agrees(b) if isinstance(a, Amount) and isinstance(b, Amount) else a == b
               for a, b in zip(one, other, strict=True))


# --- the check --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Statement:
    """One statement of a quantity: where (page and line) and what it says."""

    quantity: Quantity
    page: str
    line: int
    parts: tuple[str, ...]

    @property
    def said(self) -> str:
        return " / ".join(self.parts)

    @property
    def values(self) -> tuple[Amount | str, ...]:
        return tuple(amount(part) for part in self.parts)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}" if self.line else self.page


def _flat(text: str) -> tuple[str, list[int]]:
    """``text`` with every run of whitespace as one space (a sentence wraps anywhere), and where each of its
    characters was in ``text``."""
    parts, where = [], []
    for run in re.finditer(r"\s+|\S+", text):
        if run.group().isspace():
            parts.append(" ")
            where.append(run.start())
        else:
            parts.append(run.group())
            where.extend(range(run.start(), run.end()))
    return "".join(parts), where


def _code_value(reference: str) -> object:
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def statements(docs: Iterable[tuple[str, str]], quantities: Sequence[Quantity] = QUANTITIES) -> list[Statement]:
    """Every statement of every quantity in ``docs`` ((page, text) pairs), and the value each one's code defines."""
    found = [Statement(q, q.code, 0, (str(_code_value(q.code)),)) for q in quantities if q.code]
    for page, text in docs:
        flat, where = _flat(text)
        for quantity in quantities:
            for regex in quantity.regexes:
                for match in regex.finditer(flat):
                    groups = [(group, match.start(i + 1)) for i, group in enumerate(match.groups()) if group]
                    if groups:
                        line = text.count("\n", 0, where[groups[0][1]]) + 1
                        found.append(Statement(quantity, page, line, tuple(group for group, _ in groups)))
    return found


def check(docs: Iterable[tuple[str, str]], quantities: Sequence[Quantity] = QUANTITIES) -> list[str]:
    """What is wrong with the figures of ``docs`` ((page, text) pairs), one line each: a quantity stated with two
    values (each value with the places that state it), a homed quantity stated outside its home."""
    problems = []
    found = statements(docs, quantities)
    for quantity in quantities:
        said = [s for s in found if s.quantity is quantity]
        classes: list[list[Statement]] = []
        for statement in said:
            same = next((c for c in classes if _agree(c[0].values, statement.values)), None)
            if same is None:
                classes.append([statement])
            else:
                same.append(statement)
        if len(classes) > 1:
            values = "; ".join(f"{c[0].said} ({', '.join(s.where for s in c)})" for c in classes)
            problems.append(f"{quantity.name} is stated with {len(classes)} values: {values}")
        if quantity.home:
            for statement in said:
                if statement.line and statement.page not in quantity.home:
                    problems.append(f"{quantity.name} is stated in {statement.where} ({statement.said}), outside "
                                    f"its home {' or '.join(quantity.home)}: link to it there instead")
    return problems


# --- the docs as they are ---------------------------------------------------------------------------------------


def test_every_quantity_is_stated_one_way_and_at_its_home():
    problems = check(pages())
    assert not problems, "the docs' figures disagree:\n" + "\n".join(problems)


def test_every_quantity_of_the_table_is_found_in_the_docs():
    """A pattern that finds nothing guards nothing: reword the pattern with the page, or drop the row."""
    said = {s.quantity.name for s in statements(pages()) if s.line}
    assert not [q.name for q in QUANTITIES if q.name not in said]


def test_the_table_names_each_quantity_once_and_each_home_exists():
    names = [q.name for q in QUANTITIES]
    assert len(names) == len(set(names))
    assert all((ROOT / home).is_file() for q in QUANTITIES for home in q.home)
    assert all(re.compile(p).groups >= 1 for q in QUANTITIES for p in q.patterns)


# --- the check itself -------------------------------------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> list[tuple[str, str]]:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return pages(root)


def test_two_pages_that_state_a_quantity_differently_fail(tmp_path):
    docs = _write(tmp_path, {"docs/a.md": "# A\n\nWorkers heartbeat every 5 s.\n",
                             "docs/howto/b.md": "# B\n\nOne\nworker, which\nmay heartbeat every\n10 s, ...\n"})
    problems = check(docs)
    assert len(problems) == 1
    assert "a worker's heartbeat is stated with 2 values" in problems[0]
    assert "5 s (docs/a.md:3)" in problems[0] and "10 s (docs/howto/b.md:6)" in problems[0]


def test_two_pages_that_state_the_same_value_pass(tmp_path):
    docs = _write(tmp_path, {"docs/a.md": "Workers heartbeat every 5 s.\n",
                             "docs/b.md": "A worker's `--heartbeat-s` (see below): heartbeat every 5 s\n"})
    assert len([s for s in statements(docs) if s.line]) == 2
    assert check(docs) == []


def test_a_homed_quantity_stated_elsewhere_fails_and_at_home_passes(tmp_path):
    home = {TUTORIAL: "Two items cannot show it (that takes about 96), but ...\n"}
    assert check(_write(tmp_path, home)) == []
    docs = _write(tmp_path, {DECISIONS: "- **Few items**: the tiny example's \"rests on 2 items; the margin of "
                                        "0.05 needs about 109\".\n"})
    problems = check(docs)
    assert any("stated with 2 values: 109 (docs/decisions.md:1); 96 (docs/tutorial.md:1)" in p for p in problems)
    assert any(p.startswith("the items the tiny example needs for a margin of 0.05 is stated in docs/decisions.md:1 "
                            "(109), outside its home docs/tutorial.md") for p in problems)


def test_a_default_stated_against_the_code_fails(tmp_path):
    assert check(_write(tmp_path, {"docs/a.md": "with a fidelity margin set (default `max_kl = 0.05`)\n"})) == []
    problems = check(_write(tmp_path, {"docs/a.md": "with a fidelity margin set (default `max_kl = 0.1`)\n"}))
    assert problems == ["the default max_kl is stated with 2 values: 0.05 (kvlab.core.margins:DEFAULT_MAX_KL); "
                        "0.1 (docs/a.md:1)"]


def test_a_toml_spec_states_in_its_comments_only(tmp_path):
    docs = _write(tmp_path, {"examples/a.toml": 'name = "heartbeat every 9 s"\n# workers heartbeat every 5 s\n',
                             "docs/a.md": "Workers heartbeat every 5 s.\n"})
    assert [(s.page, s.line, s.said) for s in statements(docs) if s.line] == [
        ("docs/a.md", 1, "5 s"), ("examples/a.toml", 2, "5 s")]
    assert check(docs) == []


@pytest.mark.parametrize(("one", "other", "agree"), [
    ("about 6 minutes", "6 min 2 s", True), ("29 minutes", "29 min", True), ("about half a minute", "32 s", True),
    ("about 10 minutes", "10 min 21 s", True), ("about 12 minutes", "10 min 21 s", False),
    ("about 96", "about 109", False), ("0.05", "0.050", True), ("0.05", "0.1", False), ("5.0", "5 s", True),
    ("2.8e-5", "2.8e-5", True), ("1.14x", "1.20x", False), ("4 MiB", "4.0", True), ("2.5 GB", "2.5 MiB", False),
    ("27-41 s", "about a minute", False), ("3,578 s", "about an hour", True),
])
def test_values_agree_at_the_precision_stated(one, other, agree):
    assert _agree((amount(one),), (amount(other),)) is agree

