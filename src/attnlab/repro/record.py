"""repro.json and, rendered from it by templates/repro.md.j2 and templates/README_section.md.j2, repro.md and
the README section.

repro.json holds everything the pages print ({"meta": ..., "claims": [Claim.to_json()]}), so
``attnlab repro --render`` rebuilds the pages from it without measuring anything. Its meta also holds a hash
of each committed report file the claims read (``inputs``): a verdict judged on a report that has changed
since is stale, and ``attnlab repro --check`` (and the committed-pages test) says which.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from attnlab.repro.sources import ARTICLES, where
from attnlab.repro.verdict import rules_markdown
from attnlab.util.files import atomic_write_text
from attnlab.writing.pages import TEMPLATES, VERDICTS


def render(report: dict) -> dict[str, str]:
    """{'repro.md': ..., 'README_section.md': ...} from repro.json's content."""
    claims = sorted(report["claims"], key=lambda c: c["id"])
    tally = {v: sum(c["verdict"] == v for c in claims) for v in VERDICTS}
    context = {
        "claims": claims,
        "meta": report["meta"],
        "tally": tally,
        "verdicts": VERDICTS,
        "rules": rules_markdown(),
    }
    context |= {"where": where, "articles": list(ARTICLES.values())}
    return {name: TEMPLATES.get_template(f"{name}.j2").render(**context) for name in ("repro.md", "README_section.md")}


# what a claim reads from a report dir it cites; a cited file is read as it is
REPORT_DATA = ("ablation.csv", "summary.json", "stream.json", "runs.csv")


def cited_sources(value) -> set[str]:
    """Every ``source`` a claim's measurements name under reports/ (a study's report dir or a file)."""
    if isinstance(value, dict):
        found = {value["source"]} if str(value.get("source", "")).startswith("reports/") else set()
        return found.union(*(cited_sources(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(cited_sources(v) for v in value))
    return set()


def input_hashes(claims: list[dict], root: Path) -> dict[str, str]:
    """{path: sha256} of the report files the claims cite, paths relative to ``root`` (the checkout)."""
    hashes = {}
    for source in sorted(cited_sources(claims)):
        path = root / source
        path = path.parent if path.suffix == ".md" else path  # a page cited: the data it is rendered from
        files = [path] if path.is_file() else [path / name for name in REPORT_DATA if (path / name).is_file()]
        hashes |= {f.relative_to(root).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    return hashes


def stale_inputs(out: Path, root: Path = Path(".")) -> list[str]:
    """The report files read by the claims of ``out``/repro.json that have changed (or gone) since it was
    written; empty when every verdict was judged on the reports as they are."""
    report = json.loads((Path(out) / "repro.json").read_text())
    recorded = report["meta"].get("inputs") or {}  # none recorded: judged on reports of unknown age
    now = input_hashes(report["claims"], root)
    return [path for path, digest in sorted(recorded.items()) if now.get(path) != digest] + sorted(
        set(now) - set(recorded)
    )


def write_reports(claims: list, out: Path, meta: dict, root: Path = Path(".")) -> list[Path]:
    """repro.json from the claims (with the hashes of the report files they read), then the pages rendered
    from it; returns the paths written."""
    report = {"meta": meta, "claims": [c.to_json() for c in sorted(claims, key=lambda c: c.id)]}
    report["meta"]["inputs"] = input_hashes(report["claims"], root)
    atomic_write_text(Path(out) / "repro.json", json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    return [Path(out) / "repro.json", *render_dir(out)]


def render_dir(out: Path) -> list[Path]:
    """Re-render the pages of a report directory from its repro.json."""
    pages = render(json.loads((Path(out) / "repro.json").read_text()))
    for name, text in pages.items():
        atomic_write_text(Path(out) / name, text)
    return [Path(out) / name for name in pages]
