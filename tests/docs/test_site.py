"""The documentation site builds under ``mkdocs build --strict`` (no broken link or anchor, no page outside the
navigation), and the README stays short with every link landing on a page of the built site."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_README_LINES = 150
#: Markdown links and images: [text](target) / ![alt](target).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="mkdocs not installed: scripts/setup.sh --dev")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                           env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr[-4000:]}"
    return out


def test_the_site_builds_strictly(site):
    assert (site / "index.html").is_file() and (site / "decisions" / "index.html").is_file()


def _built_page(site: Path, target: str) -> Path:
    """Where a README link to ``docs/...`` lands in the built site (mkdocs' directory URLs)."""
    relative = Path(target).relative_to("docs")
    if relative.suffix != ".md":
        return site / relative
    return site / ("index.html" if relative.name == "index.md" else relative.with_suffix("") / "index.html")


def test_the_readme_is_short_and_its_links_land_on_the_site(site):
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES
    links = [link for link in LINK.findall(text) if not link.startswith(("http://", "https://", "mailto:"))]
    assert links, "the README links into the docs"
    for link in links:
        target, _, anchor = link.partition("#")
        assert target.startswith("docs/"), f"README link {link} is not a page of the site"
        page = _built_page(site, target)
        assert page.is_file(), f"README link {link}: {page.relative_to(site)} is not in the built site"
        if anchor:
            assert f'id="{anchor}"' in page.read_text(encoding="utf-8"), f"README link {link}: no such anchor"


def test_the_readmes_spec_is_a_valid_spec():
    import tomllib

    from kvlab.core.experiment_spec import ExperimentSpec

    toml = re.search(r"```toml\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert toml, "the README shows a spec"
    assert ExperimentSpec(**tomllib.loads(toml.group(1))).sweep is not None
