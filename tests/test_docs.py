"""The README and docs/ are the door: every relative link resolves, and the README holds a few linked findings."""

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
