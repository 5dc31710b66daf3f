"""repro.json and, rendered from it by templates/repro.md.j2 and templates/README_section.md.j2, repro.md and
the README section.

repro.json holds everything the pages print ({"meta": ..., "claims": [Claim.to_json()]}), so
``attnlab repro --render`` rebuilds the pages from it without measuring anything.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.repro.sources import ARTICLES, where
from attnlab.util.files import atomic_write_text
from attnlab.writing.pages import TEMPLATES, VERDICTS


def render(report: dict) -> dict[str, str]:
    """{'repro.md': ..., 'README_section.md': ...} from repro.json's content."""
    claims = sorted(report["claims"], key=lambda c: c["id"])
    tally = {v: sum(c["verdict"] == v for c in claims) for v in VERDICTS}
    context = {"claims": claims, "meta": report["meta"], "tally": tally, "verdicts": VERDICTS}
    context |= {"where": where, "articles": list(ARTICLES.values())}
    return {name: TEMPLATES.get_template(f"{name}.j2").render(**context) for name in ("repro.md", "README_section.md")}


def write_reports(claims: list, out: Path, meta: dict) -> list[Path]:
    """repro.json from the claims, then the pages rendered from it; returns the paths written."""
    report = {"meta": meta, "claims": [c.to_json() for c in sorted(claims, key=lambda c: c.id)]}
    atomic_write_text(Path(out) / "repro.json", json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    return [Path(out) / "repro.json", *render_dir(out)]


def render_dir(out: Path) -> list[Path]:
    """Re-render the pages of a report directory from its repro.json."""
    pages = render(json.loads((Path(out) / "repro.json").read_text()))
    for name, text in pages.items():
        atomic_write_text(Path(out) / name, text)
    return [Path(out) / name for name in pages]
