"""``attnlab render``: every page, table and figure under reports/ written again from the data committed
beside it, and the blocks hand-written pages include (``BLOCKS``: the README's findings, the verdict rules
in docs/inference.md); nothing is trained or measured.

A file under reports/ is either a record (data a command wrote from its runs or measurements: ``RECORDS``
names each kind and its writer) or a render of records. ``check_dir`` finds what is neither: a file no code
writes from committed data, which ``--check`` and the tests refuse, as they refuse a render that differs.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pandas as pd

from attnlab.repro import record
from attnlab.repro.verdict import rules_markdown
from attnlab.studies import findings, stream_study
from attnlab.studies.report import write_report
from attnlab.studies.sink_search import page
from attnlab.sweeps import plan
from attnlab.tools.bench import bench_report, decode, gpt2_cpu
from attnlab.util.cli import command_parser
from attnlab.util.files import atomic_write_text
from attnlab.writing import markdown

# what each kind of record under reports/ is and which command writes it (paths relative to reports/)
RECORDS = {
    "*/runs.csv": "attnlab report: one row per run and seed",
    "*/histories.csv": "attnlab report: the runs' values over training",
    "*/summary.json": "attnlab report: the study's own entries (its pages render the rest again)",
    "*/plan.json": "attnlab plan",
    "*/verify.json": "attnlab verify",
    "*/stream.json": "attnlab stream-study",
    "sinks/ablation.csv": "a report written before runs.csv: each cell's mean, std and count",
    "repro/repro.json": "attnlab repro",
    "repro/*.png": "attnlab repro: figures of what it measured, drawn as it measures",
    "bench/*.json": "attnlab bench",
    "inference/sample_speed.json": "attnlab bench --mode decode",
    "inference/stream.json": "attnlab stream: one checkpoint's rolling-cache perplexities",
    "inference/stream.md": "attnlab stream: written from the checkpoint it decodes",
    "heads/text_model_heads.*": "attnlab analyze: head scores of a checkpoint",
    "train/*.png": "attnlab report --compare: maps and statistics of two run dirs",
    "text_sinks/search.csv": "attnlab sink-search",
}


def is_record(path: str) -> bool:
    return any(fnmatch.fnmatch(path, pattern) for pattern in RECORDS)


def check_dir(reports: Path, name: str, scratch: Path) -> tuple[list[str], list[str]]:
    """Render ``reports/name`` again in ``scratch`` from its records alone; returns (orphans: files the
    render did not write, stale: files that differ from it), as paths relative to ``reports``."""
    source, copy = reports / name, scratch / name
    for path in source.rglob("*"):
        rel = str(path.relative_to(reports))
        if path.is_file() and is_record(rel):
            (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, scratch / rel)
    copy.mkdir(parents=True, exist_ok=True)
    for out in sorted({copy, *(p for p in copy.rglob("*") if p.is_dir())}):
        render_dir(out)
    orphan, stale = [], []
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        rel = str(path.relative_to(reports))
        if not (scratch / rel).is_file():
            orphan.append(rel)
        elif (scratch / rel).read_bytes() != path.read_bytes():
            stale.append(rel)
    return orphan, stale


def render_dir(out: Path, draw: bool = True) -> None:
    """Every page of one report dir again from its records."""
    if (out / "stream.json").is_file() and (out / "summary.json").is_file():  # before the page that shows it
        stream_study.write(stream_study.rerender(json.loads((out / "stream.json").read_text())), out)
    if (out / "summary.json").is_file():
        if (out / "plan.json").is_file():
            atomic_write_text(out / "plan.md", plan.markdown(json.loads((out / "plan.json").read_text())))
        write_report(out, draw=draw)
    if (out / "repro.json").is_file():
        record.render_dir(out)
    if (out / "bench.json").is_file():
        data = json.loads((out / "bench.json").read_text())
        bench_report.write_markdown(data, out)
        if draw:
            bench_report.write_plots(data, out)
    if (out / "breakdown.json").is_file():
        bench_report.write_breakdown(json.loads((out / "breakdown.json").read_text()), out)
    if (out / "gpt2_cpu.json").is_file():
        atomic_write_text(out / "gpt2_cpu.md", gpt2_cpu.markdown(json.loads((out / "gpt2_cpu.json").read_text())))
    if (out / "sample_speed.json").is_file():
        atomic_write_text(out / "sample_speed.md", decode.markdown(json.loads((out / "sample_speed.json").read_text())))
    if (out / "search.csv").is_file():
        frame = pd.read_csv(out / "search.csv")
        from_studies = frame["source"].astype(str).str.endswith("runs.csv")
        studies = list(dict.fromkeys(frame.loc[from_studies, "study"]))
        atomic_write_text(out / "search.md", page(frame, studies, int((~from_studies).sum())))


# the rendered blocks of hand-written pages: (page relative to the checkout, block name, its render)
BLOCKS = (
    ("README.md", "findings", lambda reports: findings.render(reports)),
    ("docs/inference.md", "verdict-rules", lambda reports: rules_markdown()),
)


def render_blocks(root: Path, reports: Path) -> dict[Path, str]:
    """Each page with a rendered block: its text with every block rendered afresh."""
    pages = {}
    for rel, name, render in BLOCKS:
        path = root / rel
        text = pages.get(path) or path.read_text(encoding="utf-8")
        pages[path] = markdown.splice(text, name, render(reports), rel)
    return pages


def render_all(reports: Path, root: Path | None, draw: bool = True) -> None:
    for out in sorted(p for p in reports.iterdir() if p.is_dir()):
        render_dir(out, draw)
    for path, text in (render_blocks(root, reports) if root is not None else {}).items():
        if text != path.read_text(encoding="utf-8"):
            atomic_write_text(path, text)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("render", "Every page and figure under reports/ again from its committed data.")
    parser.add_argument("--reports", type=Path, default=Path("reports"))
    parser.add_argument(
        "--root", type=Path, default=Path("."), help="the checkout whose README and docs blocks to render (default .)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing: exit 1 on a file no code writes or that differs from its render",
    )
    args = parser.parse_args(argv)
    if not args.reports.is_dir():
        parser.error(f"--reports={args.reports} is not a directory; expected the reports/ folder")
    if not args.check:
        render_all(args.reports, args.root if (args.root / "README.md").is_file() else None)
        print(f"attnlab: rendered every report under {args.reports} from its records")
        return 0
    bad = 0
    with tempfile.TemporaryDirectory() as scratch:
        for out in sorted(p for p in args.reports.iterdir() if p.is_dir()):
            orphan, stale = check_dir(args.reports, out.name, Path(scratch))
            for rel in orphan:
                print(f"attnlab: reports/{rel}: no code writes it from committed data (an orphan)", file=sys.stderr)
            for rel in stale:
                print(f"attnlab: reports/{rel}: differs from its fresh render (attnlab render)", file=sys.stderr)
            bad += len(orphan) + len(stale)
    print(f"attnlab: {bad} files under {args.reports} are orphans or stale")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
