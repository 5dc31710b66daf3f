"""repro.json and, rendered from it by the templates in templates/, repro.md and the README section.

repro.json holds everything the pages print ({"meta": ..., "claims": [Claim.to_json()]}), so
``attnlab repro --render`` rebuilds the pages from it without measuring anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2

from ...markdown import markdown_table
from ...results import atomic_write_text
from .sources import ARTICLES, where
from .verdict import VERDICTS, fmt

TEMPLATES = Path(__file__).parent / "templates"


def _cell(x) -> str:
    """A value as a Markdown table cell: formatted, on one line, its pipes escaped."""
    return fmt(x).replace("\n", " ").replace("|", "\\|")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _cell
    env.filters["table"] = lambda t: markdown_table(t["columns"], [[fmt(x) for x in row] for row in t["rows"]])
    env.globals.update(where=where, articles=list(ARTICLES.values()), verdicts=VERDICTS)
    return env


def render(report: dict) -> dict[str, str]:
    """{'repro.md': ..., 'README_section.md': ...} from repro.json's content."""
    claims = sorted(report["claims"], key=lambda c: c["id"])
    tally = {v: sum(c["verdict"] == v for c in claims) for v in VERDICTS}
    env = _environment()
    context = {"claims": claims, "meta": report["meta"], "tally": tally}
    return {
        "repro.md": env.get_template("repro.md.j2").render(**context),
        "README_section.md": env.get_template("README_section.md.j2").render(**context),
    }


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
