"""Every committed page is a render of the committed data beside it, byte for byte: a study's ablation.md,
index.html (with the figures beside it embedded, byte for byte), ablation.csv and summary.json from its
runs.csv (or ablation.csv), stream.md from
stream.json, repro.md and its README section from repro.json, the README's findings block, and the benchmark
pages from their json. Not rendered from data: reports/inference/stream.md and reports/heads/ (written from
checkpoints)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attnlab.repro import record
from attnlab.studies import findings, stream_study
from attnlab.studies.report import write_report
from attnlab.tools.bench import bench_report, decode, gpt2_cpu

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
STUDIES = sorted(p.parent.name for p in REPORTS.glob("*/ablation.md"))
STREAMS = sorted(p.parent.name for p in REPORTS.glob("*/stream.json") if (p.parent / "summary.json").is_file())
STUDY_PAGES = ("ablation.md", "index.html", "ablation.csv", "summary.json", "runs.csv")


def text(path: Path) -> str:
    return path.read_bytes().decode()


@pytest.mark.parametrize("study", STUDIES)
def test_a_study_report_is_the_render_of_its_data(study, tmp_path):
    out = tmp_path / study
    shutil.copytree(REPORTS / study, out)
    for name in STUDY_PAGES:
        if name != "runs.csv" and (name != "ablation.csv" or (out / "runs.csv").is_file()):
            (out / name).unlink(missing_ok=True)
    write_report(out, json.loads((REPORTS / study / "summary.json").read_text()), draw=False)
    for name in STUDY_PAGES:
        assert (out / name).is_file() == (REPORTS / study / name).is_file(), name
        if (out / name).is_file():
            assert text(out / name) == text(REPORTS / study / name), name


@pytest.mark.parametrize("study", STREAMS)
def test_a_stream_page_is_the_render_of_its_stream_json(study):
    report = json.loads((REPORTS / study / "stream.json").read_text())
    assert stream_study.markdown(stream_study.rerender(report)) == text(REPORTS / study / "stream.md")


def test_the_repro_pages_are_the_render_of_repro_json():
    pages = record.render(json.loads((REPORTS / "repro" / "repro.json").read_text()))
    assert sorted(pages) == ["README_section.md", "repro.md"]
    for name, page in pages.items():
        assert page == text(REPORTS / "repro" / name), name


def test_the_repro_was_judged_on_the_committed_reports():
    """Every report file a claim reads is the one its verdict was judged on (else: attnlab repro --mode full)."""
    assert record.stale_inputs(ROOT / "reports" / "repro", ROOT) == []


def test_the_readme_findings_are_the_render_of_the_reports():
    readme = text(ROOT / "README.md")
    assert findings.splice(readme, findings.render(REPORTS)) == readme


@pytest.mark.parametrize(
    "page, render",
    [
        ("bench/bench.md", lambda data, out: bench_report.write_markdown(data, out).read_text()),
        ("bench/breakdown.md", lambda data, out: bench_report.write_breakdown(data, out).read_text()),
        ("bench/gpt2_cpu.md", lambda data, out: gpt2_cpu.markdown(data)),
        ("inference/sample_speed.md", lambda data, out: decode.markdown(data)),
    ],
)
def test_a_benchmark_page_is_the_render_of_its_json(page, render, tmp_path):
    data = json.loads((REPORTS / page).with_suffix(".json").read_text())
    assert render(data, tmp_path) == text(REPORTS / page)
