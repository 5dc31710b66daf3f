"""Every file under reports/ is a record (data a command wrote from its runs, ``rerender.RECORDS``) or the
render of records, byte for byte: each report dir rendered again from its records alone gives back every
page, table and figure it holds, and nothing else is there. Every block a hand-written page includes is
its render, and the repro was judged on the report files it reads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnlab.repro import record
from attnlab.tools.render import check_dir, is_record, render_blocks

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
DIRS = sorted(p.name for p in REPORTS.iterdir() if p.is_dir())


def text(path: Path) -> str:
    return path.read_bytes().decode()


@pytest.mark.parametrize("name", DIRS)
def test_a_report_dir_is_its_records_and_their_fresh_render(name, tmp_path):
    orphans, stale = check_dir(REPORTS, name, tmp_path)
    assert orphans == [], "no code writes these from committed data"
    assert stale == [], "these differ from a render of their records (attnlab render)"


def test_a_stray_file_and_a_stale_page_are_found(tmp_path):
    reports = tmp_path / "reports"
    shutil.copytree(REPORTS / "gqa_long", reports / "gqa_long")
    (reports / "gqa_long" / "frontier.md").write_text("a page no code writes\n")
    page = reports / "gqa_long" / "ablation.md"
    page.write_text(page.read_text().replace("gqa_long", "gqa_lung", 1))
    orphans, stale = check_dir(reports, "gqa_long", tmp_path / "scratch")
    assert orphans == ["gqa_long/frontier.md"] and stale == ["gqa_long/ablation.md"]
    assert is_record("gqa_long/runs.csv") and not is_record("gqa_long/ablation.md")


def test_the_repro_was_judged_on_the_committed_reports():
    """Every report file a claim reads is the one its verdict was judged on (else: attnlab repro --mode full)."""
    assert record.stale_inputs(ROOT / "reports" / "repro", ROOT) == []


def test_every_rendered_block_of_a_page_is_its_fresh_render():
    """The README's findings from the reports, the verdict rules in docs/inference.md from the rule table."""
    for path, fresh in render_blocks(ROOT, REPORTS).items():
        assert fresh == text(path), path
