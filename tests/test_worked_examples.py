"""Every worked example in docs/development.md, followed as written on a copy of the repository: its files
written (each fenced block under a ``<!-- worked-example NAME: create|append PATH -->`` marker), then
``make generated``, then the tests that read what it adds; they must pass, so a reader who follows the page
keeps ``make test`` green."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "development.md"
STEP = re.compile(r"<!-- worked-example (\w+): (create|append) (\S+) -->\n\s*```\w*\n(.*?)\n\s*```", re.S)
# the tests each example's additions reach: every registry, generated file and experiment they enumerate
READERS = {
    "relu": [
        "test_normalizations.py",
        "test_generated.py",
        "test_variants.py",
        "test_schema.py",
        "test_relu_attention.py",
    ],
    "escape_kinds": ["test_generated.py", "test_study.py", "test_docs_studies.py", "test_config_layout.py"],
}
COPIED = ("src", "conf", "tests", "docs", "sweeps", "reports", "README.md", "pyproject.toml", "setup.py", "Makefile")


def steps(name: str) -> list[tuple[str, str, str]]:
    """(action, path, text) of one worked example, in the page's order."""
    return [
        (action, path, textwrap.dedent(body) + "\n")
        for example, action, path, body in STEP.findall(PAGE.read_text(encoding="utf-8"))
        if example == name
    ]


def test_the_page_marks_each_worked_example():
    assert sorted({m[0] for m in STEP.findall(PAGE.read_text(encoding="utf-8"))}) == sorted(READERS)
    assert [a for a, _, _ in steps("relu")] == ["append", "create", "create"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(READERS))
def test_a_worked_example_followed_as_written_keeps_the_tests_green(name, tmp_path):
    copy = tmp_path / "repo"
    for item in COPIED:
        (shutil.copytree if (ROOT / item).is_dir() else shutil.copy)(ROOT / item, copy / item)
    for action, path, text in steps(name):
        target = copy / path
        assert (action == "append") == target.is_file(), f"{path}: {action} as the page says"
        with open(target, "a" if action == "append" else "w", encoding="utf-8") as f:
            f.write(("\n\n" if action == "append" else "") + text)
    env = dict(os.environ) | {"PYTHONPATH": str(copy / "src")}
    generated = subprocess.run(
        [sys.executable, "-m", "attnlab.tools.generated"], cwd=copy, env=env, capture_output=True, text=True
    )
    assert generated.returncode == 0, generated.stderr[-2000:]
    tests = [f"tests/{t}" for t in READERS[name]]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow", *tests],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:]
