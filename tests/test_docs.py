"""The README and docs/ are the door: every link resolves, every make target and config key they name exists,
results.md indexes every report, and the README holds a few linked findings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def relative_links(page: Path) -> list[str]:
    """Targets of Markdown links and images outside code fences, without URLs or pure anchors."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_link_parser_sees_links_and_skips_urls_and_code(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("[a](docs/a.md) ![img](r/x.png#top) [u](https://x.org) [h](#sec)\n```\n[c](code.md)\n```\n")
    assert relative_links(page) == ["docs/a.md", "r/x.png#top"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    missing = [t for t in relative_links(page) if not (page.parent / t.split("#")[0]).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_readme_is_a_door_not_a_notebook():
    """At most six findings, each a bullet that links the committed report holding its numbers,
    and one figure from a committed report."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## Findings")
    findings = re.findall(r"^- .*?(?=^- |\Z)", text[start : text.index("\n## ", start + 1)], re.MULTILINE | re.DOTALL)
    assert 1 <= len(findings) <= 6, len(findings)
    for finding in findings:
        assert any(t.startswith("reports/") for t in (m.group(1) for m in LINK.finditer(finding))), finding[:80]
    figures = [m.group(1) for m in re.finditer(r"!\[[^\]]*\]\(([^)\s]+)\)", FENCE.sub("", text))]
    assert len(figures) == 1 and figures[0].startswith("reports/") and figures[0].endswith(".png"), figures


MAKE_TARGET = re.compile(r"(?:^|`|\$ )make ([a-z][a-z0-9-]*)", re.MULTILINE)
CONFIG_KEY = re.compile(r"`((?:model|optim|trainer|checkpoint|callbacks|data)\.[a-z_][\w.]*)")


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_make_target_named_exists(page):
    named = set(MAKE_TARGET.findall(page.read_text(encoding="utf-8")))
    assert not named - makefile_targets(), f"{page.relative_to(ROOT)} names make targets the Makefile lacks"


def test_make_target_parser_reads_code_and_skips_prose():
    assert MAKE_TARGET.findall("`make train` and\nmake sweep SEEDS=3\nto make sure") == ["train", "sweep"]


def _flat_keys(node, prefix: str = ""):
    for key, value in node.items():
        yield prefix + str(key)
        if isinstance(value, dict):
            yield from _flat_keys(value, f"{prefix}{key}.")


def known_config_keys() -> set[str]:
    """The schema's keys, the default composed config's, and every key a data preset sets (the data block
    differs per preset)."""
    import yaml
    from omegaconf import OmegaConf

    from attnlab.config.compose import compose_config
    from attnlab.config.schema import walk

    keys = {key for key, _, _ in walk()}
    keys |= set(_flat_keys(OmegaConf.to_container(compose_config([]), resolve=False)))
    for preset in (ROOT / "conf" / "data").glob("*.yaml"):
        keys |= {f"data.{k}" for k in _flat_keys(yaml.safe_load(preset.read_text()) or {})}
    return keys


def test_every_config_key_named_exists():
    known = known_config_keys()
    unknown = {
        (key.rstrip("."), str(page.relative_to(ROOT)))
        for page in PAGES
        for key in CONFIG_KEY.findall(page.read_text(encoding="utf-8"))
        if key.rstrip(".") not in known
    }
    assert not unknown, f"config keys the pages name that no config or schema holds: {sorted(unknown)}"


def test_results_index_links_every_report():
    """Each reports/<dir>/ with a report in it is linked from docs/results.md."""
    index = ROOT / "docs" / "results.md"
    linked = {(index.parent / t).resolve().relative_to(ROOT).parts[1] for t in relative_links(index) if "reports/" in t}
    reports = {
        d.name for d in (ROOT / "reports").iterdir() if d.is_dir() and (any(d.glob("*.md")) or any(d.glob("*.png")))
    }
    assert not reports - linked, f"reports docs/results.md does not link: {sorted(reports - linked)}"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.MULTILINE)}


def test_slug_follows_github():
    assert slug("Long context: the default callbacks against `callbacks=none`") == (
        "long-context-the-default-callbacks-against-callbacksnone"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_anchor_into_a_page_exists(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        if anchor and path.endswith(".md") and (page.parent / path).exists():
            if anchor not in anchors(page.parent / path):
                broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to headings that do not exist: {broken}"
