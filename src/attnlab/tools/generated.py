"""Every file part that code derives: ``python -m attnlab.tools.generated [--check]`` (``make generated``).

The key table and the study table of docs/configuration.md (from the schema's fields; from each
experiment's grid and ``question.summary``), the metric table of docs/metrics.md
(from attention.stats.METRICS) and the W&B grid sweep files sweeps/<study>.yaml (from conf/experiment/).
A change to a field, a metric, a normalization or a study's grid is followed by one run of this; the
tests fail while any of them is stale. ``--check`` writes nothing and exits 1 naming the stale files.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from attnlab.attention.stats import metrics_table
from attnlab.config.compose import compose_config
from attnlab.config.schema import Schema, accepted, plain_value, walk
from attnlab.config.study import DEFAULT_STUDY, load_study, study_names
from attnlab.sweeps.sweep import wandb_sweep_yaml
from attnlab.util.cli import command_parser
from attnlab.util.files import atomic_write_text
from attnlab.writing.markdown import markdown_table

ROOT = Path(__file__).resolve().parents[3]
NO_WANDB_SWEEP = {"smoke"}  # the dk_scaling grid at 6 steps, for tests and CI


def study_table() -> str:
    """docs/configuration.md's study table: each study's grid as Hydra composes it and its ``question.summary``."""

    def value(v) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    rows = ["| `SWEEP=` | grid | the question |", "|---|---|---|"]
    for name in [DEFAULT_STUDY, *(n for n in study_names() if n != DEFAULT_STUDY)]:
        study = load_study(name)
        grid = " × ".join(f"`{k}` ∈ {{{', '.join(map(value, vs))}}}" for k, vs in study.grid.items())
        default = " (default)" if name == DEFAULT_STUDY else ""
        rows.append(f"| `{name}`{default} | {grid} | {study.question.summary or study.question.ask} |")
    return "\n".join(rows)


def default_text(key: str, composed) -> str:
    """The value a run without overrides gets (the composed default config's), or "-" where it sets
    no such key (an option of a group, data=tokens say, does)."""
    missing = object()
    value = plain_value(OmegaConf.select(composed, key, default=missing))
    if value is missing:
        return "-"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _code(text: str) -> str:
    return text if text == "-" else f"`{text}`"


def key_table(composed=None, cls=Schema) -> str:
    """docs/configuration.md's key table: every key the schema declares, its default in the
    composed default config (``attnlab train`` with no overrides), what it accepts and what it does."""
    if composed is None:
        composed = compose_config()
    rows = [
        (f"`{key}`", _code(default_text(key, composed)), accepted(f), f.metadata.get("doc", ""))
        for key, f, _ in walk(cls)
    ]
    return markdown_table(("key", "default", "accepts", "what it sets"), rows)


# <page>: [(marker name, what renders the block between its start and end markers)]
BLOCKS: dict[str, list[tuple[str, Callable[[], str]]]] = {
    "docs/configuration.md": [("key table", key_table), ("study table", study_table)],
    "docs/metrics.md": [("metrics registry", metrics_table)],
}


def with_block(text: str, marker: str, block: str) -> str:
    pattern = re.compile(rf"(<!-- {marker}: start -->\n)(.*?)(\n<!-- {marker}: end -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"attnlab: error: the page lost its <!-- {marker}: start/end --> markers; expected both")
    return pattern.sub(lambda m: m.group(1) + block + m.group(3), text)


def expected(root: Path | None = None) -> dict[Path, str]:
    """Each generated file's path (under ``root``, default the checkout) and the content it should have now."""
    root, out = root or ROOT, {}
    for page, blocks in BLOCKS.items():
        path = root / page
        text = path.read_text(encoding="utf-8")
        for marker, render in blocks:
            text = with_block(text, marker, render())
        out[path] = text
    for name in study_names():
        spec = root / "sweeps" / f"{name}.yaml"
        if name in NO_WANDB_SWEEP or (spec.is_file() and yaml.safe_load(spec.read_text())["method"] != "grid"):
            continue  # a search sweep is written by hand
        out[spec] = wandb_sweep_yaml(name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("generated", __doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the stale files")
    args = parser.parse_args(argv)
    texts = expected()
    stale = [path for path, text in texts.items() if not path.is_file() or path.read_text(encoding="utf-8") != text]
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'} {path.relative_to(ROOT)}")
    if args.check:
        return 1 if stale else 0
    for path in stale:
        atomic_write_text(path, texts[path])
    return 0


if __name__ == "__main__":
    sys.exit(main())
