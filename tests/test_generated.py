"""make generated: every derived file part (the docs' key and metric tables, the W&B grid sweeps) is
named when stale and rewritten to what the code gives now."""

from __future__ import annotations

import shutil
from pathlib import Path

from attnlab.attention import normalizations
from attnlab.attention.normalizations import SIGMOID, register
from attnlab.tools import generated

ROOT = Path(__file__).resolve().parents[1]


def copy_generated(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    for page in generated.BLOCKS:
        shutil.copy(ROOT / page, tmp_path / page)
    shutil.copytree(ROOT / "sweeps", tmp_path / "sweeps")
    return tmp_path


def test_the_checkout_is_up_to_date():
    assert generated.main(["--check"]) == 0


def test_a_stale_file_is_named_then_rewritten(tmp_path, monkeypatch, capsys):
    root = copy_generated(tmp_path)
    spec = root / "sweeps" / "variants.yaml"
    spec.write_text(spec.read_text().replace("sigmoid", "cosine"))
    monkeypatch.setattr(generated, "ROOT", root)
    assert generated.main(["--check"]) == 1
    assert capsys.readouterr().out.splitlines() == ["stale sweeps/variants.yaml"]
    assert generated.main([]) == 0 and spec.read_text() == (ROOT / "sweeps" / "variants.yaml").read_text()
    assert generated.main(["--check"]) == 0


def test_a_registered_normalization_reaches_the_key_table(tmp_path, monkeypatch, capsys):
    root = copy_generated(tmp_path)
    monkeypatch.setattr(generated, "ROOT", root)
    register(SIGMOID.__class__(**{**SIGMOID.__dict__, "name": "probe_norm"}))
    try:
        assert generated.main([]) == 0
        assert capsys.readouterr().out.splitlines() == ["wrote docs/configuration.md"]
        assert ", probe_norm |" in (root / "docs" / "configuration.md").read_text()
    finally:
        del normalizations.REGISTRY["probe_norm"]
