"""docs/configuration.md's study table states each study's grid as its file in conf/experiment/ does."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AXIS = re.compile(r"`([\w.]+)` ∈ \{([^}]*)\}")


def grids_in_files() -> dict[str, dict[str, list[str]]]:
    """Each study's grid as Hydra composes it (an experiment that starts from another inherits its axes)."""
    from attnlab.config.study import load_study, study_names

    return {
        study: {k: [str(v) for v in values] for k, values in load_study(study).grid.items()} for study in study_names()
    }


def grids_in_doc() -> dict[str, dict[str, list[str]]]:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    start = text.index("| `SWEEP=` |")
    text = text[start : text.index("\n\n", start)]
    rows = re.findall(r"^\| `(\w+)`(?: \(default\))? \| ([^|]*) \|", text, re.MULTILINE)
    return {
        study: {key: [v.strip() for v in values.split(",")] for key, values in AXIS.findall(grid)}
        for study, grid in rows
    }


def normalise(values: list[str]) -> list:
    """Numbers as numbers (1e-3 = 0.001), words in lower case (YAML reads false as a boolean, the doc
    writes it as Hydra overrides do)."""

    def one(v: str):
        try:
            return float(v)
        except ValueError:
            return v.lower()

    return [one(v) for v in values]


def test_every_study_is_in_the_table_with_its_grid():
    files, doc = grids_in_files(), grids_in_doc()
    assert set(files) == set(doc), (
        f"studies in conf/experiment/ but not in the table, or the other way: {set(files) ^ set(doc)}"
    )
    for study, grid in files.items():
        assert {k: normalise(v) for k, v in grid.items()} == {k: normalise(v) for k, v in doc[study].items()}, study


def test_the_table_parser_reads_axes_and_values():
    assert AXIS.findall("`a.b` ∈ {1, 2} × `c` ∈ {x}") == [("a.b", "1, 2"), ("c", "x")]


def test_the_default_cadence_table_is_the_config():
    from omegaconf import OmegaConf

    from attnlab.config.compose import compose_config

    cfg = compose_config([])
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| [^|]+ \| `([\w.]+)` \| (\d+) \| ([^|]+) \|$", text, re.MULTILINE)
    assert len(rows) >= 7, rows
    steps = int(cfg.trainer.max_steps)
    for key, every, resolves in rows:
        assert int(OmegaConf.select(cfg, key, throw_on_missing=True)) == int(every), key
        if "points" in resolves or "samples" in resolves:
            assert resolves.split()[0] == str(steps // int(every)), (key, resolves)
