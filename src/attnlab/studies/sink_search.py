"""The text-sink search's table: does any head of a GPT trained on text put 0.3 of its weight on the first token?

Gu et al. 2024 call a head a sink where its mean first-token weight reaches 0.3. This gathers that weight
(``heads/sink_max``) from run dirs and from the committed studies that train on text, one row per run with
its setting, so one page says which settings were searched and whether any of them grew a sink.

    attnlab sink-search RUN_DIR [RUN_DIR ...] [--studies dk_scaling,gqa] [--out reports/text_sinks]

A study is ``reports/<study>/runs.csv`` with ``conf/experiment/<study>.yaml``; each row's setting is that
experiment composed with the row's axes. Writes ``<out>/search.csv`` (every row) and ``<out>/search.md``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

from attnlab.analysis.phase import head_history
from attnlab.attention.stats import SINK_EPSILON, is_sink
from attnlab.config.study import study_names
from attnlab.data.tokens import META, read_meta
from attnlab.studies.report.data import DEFAULT_BUDGET, axes_of, cell_overrides, current_config, read_runs
from attnlab.training.results import RESULTS
from attnlab.util.cli import command_parser
from attnlab.util.files import atomic_write_text
from attnlab.writing.pages import TEMPLATES, plain, where

THRESHOLD = SINK_EPSILON  # Gu et al. 2024's 0.3 (attention.stats.is_sink)
REACHED = f"step_reached_{THRESHOLD}"
TEXT_MODULES = (
    "attnlab.data.TextDataModule",
    "attnlab.data.text.TextDataModule",
    "attnlab.data.tokens.TokenDataModule",
)
SETTING = ["corpus", "tokenizer", "n_layer", "d_model", "block_size", "max_steps", "bos"]
TRIED = ["corpus", "tokenizer", "n_layer", "block_size", "max_steps", "bos"]  # the page's list of values searched
COLUMNS = [
    "study",
    "overrides",
    *SETTING[:3],
    "n_head",
    *SETTING[3:],
    "seed",
    "val_loss",
    "attention_free_level",
    "first_token_weight",
    "first_token_layer",
    REACHED,
    "layer_sink_mass_max",
    "source",
]
HEAD_LAYER, LAYER_MASS = re.compile(r"heads/L(\d+)/sink_max"), re.compile(r"attn/L\d+/sink_mass")
TOKENIZERS = {"chars": "character", "bpe": "BPE", "ids": "ids"}


def number(value) -> float | None:
    """A finite float, or None (a missing metric, an empty CSV cell)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def trains_on_text(config: dict) -> bool:
    return (config.get("data") or {}).get("_target_") in TEXT_MODULES


def corpus_of(data: dict) -> str:
    """The data module's class name and what it reads: ``TextDataModule:shakespeare``."""
    name = str(data.get("_target_", "")).rsplit(".", 1)[-1]
    where_from = data.get("path") or data.get("dir") or data.get("source")
    return f"{name}:{where_from}" if where_from else name


def tokenizer_name(spec: dict) -> str:
    """A saved tokenizer (vocab.json, meta.json's ``tokenizer``) by kind; tiktoken by its encoding."""
    if spec.get("kind") == "tiktoken":
        return str(spec.get("encoding", "tiktoken"))
    return TOKENIZERS.get(spec.get("kind") or ("chars" if "chars" in spec else ""), "")


def tokenizer_of(data: dict, run_dir: Path | None = None) -> str:
    """Characters for the text module; for a token corpus the run's vocab.json, else the corpus' meta.json."""
    if not str(data.get("_target_", "")).endswith("TokenDataModule"):
        return "character"
    vocab = run_dir / "vocab.json" if run_dir is not None else None
    if vocab is not None and vocab.is_file():
        return tokenizer_name(json.loads(vocab.read_text()))
    directory = Path(str(data.get("dir", "")))
    if (directory / META).is_file():
        return tokenizer_name(read_meta(directory).get("tokenizer") or {})
    return ""


def setting_of(config: dict) -> dict:
    """What a run trained, as the table's setting columns (the tokenizer is filled in by the caller)."""
    data, model, trainer = config.get("data") or {}, config.get("model") or {}, config.get("trainer") or {}
    return {
        "corpus": corpus_of(data),
        "n_layer": model.get("n_layer"),
        "n_head": model.get("n_head"),
        "d_model": model.get("d_model"),
        "block_size": model.get("block_size"),
        "max_steps": trainer.get("max_steps"),
        "bos": bool(data.get("bos", False)),
    }


def first_token(metrics) -> dict:
    """The best head's first-token weight, its layer, and the largest layer mean of attn/L{i}/sink_mass."""
    weight = number(metrics.get("heads/sink_max"))
    layers = {
        int(m[1]): v for k, x in metrics.items() if (m := HEAD_LAYER.fullmatch(k)) and (v := number(x)) is not None
    }
    masses = [v for k, x in metrics.items() if LAYER_MASS.fullmatch(k) and (v := number(x)) is not None]
    layer = min((i for i, v in layers.items() if weight is not None and v >= weight), default=None)
    return {"first_token_weight": weight, "first_token_layer": layer, "layer_sink_mass_max": max(masses, default=None)}


def step_reached(history: list[dict], threshold: float = THRESHOLD) -> int | None:
    """The first measured step at which the best head's first-token weight reaches ``threshold``."""
    return next((h["step"] for h in history if (number(h.get("sink_max")) or 0.0) > threshold), None)


def run_row(run_dir: Path) -> dict:
    """One run dir's row, from its results.json and the head analysis' history in heads.json."""
    results = json.loads((run_dir / RESULTS).read_text())
    config, metrics = results.get("config") or {}, results.get("metrics") or {}
    level = results.get("attention_free_level") or {}
    return {
        "study": config.get("study", ""),
        "overrides": " ".join(results.get("overrides") or []),
        **setting_of(config),
        "tokenizer": tokenizer_of(config.get("data") or {}, run_dir),
        "seed": config.get("seed"),
        "val_loss": number(metrics.get("val/loss")),
        "attention_free_level": number(level.get("bigram")),
        **first_token(metrics),
        REACHED: step_reached(head_history(run_dir)),
        "source": str(run_dir),
    }


def study_config(study: str, axes: dict, budget: str) -> dict:
    return current_config(cell_overrides(study, axes, budget))


def study_rows(study: str, reports: Path) -> list[dict]:
    """One row per finished run of a study's runs.csv that trains on text, its setting composed from its axes."""
    path = reports / study / "runs.csv"
    frame = read_runs(path)
    axes = axes_of(frame)
    summary = reports / study / "summary.json"
    level = (json.loads(summary.read_text()).get("attention_free_level") or {}) if summary.is_file() else {}
    configs: dict[tuple, dict] = {}
    rows = []
    for _, row in frame[frame["status"] == "ok"].iterrows():
        cell = {a: row[a] for a in axes}
        key = (*cell.values(), row["budget"])
        if key not in configs:
            configs[key] = study_config(study, cell, row["budget"])
        config = configs[key]
        if not trains_on_text(config):
            continue
        rows.append(
            {
                "study": study,
                "overrides": " ".join(cell_overrides(study, cell, row["budget"])[1:]),
                **setting_of(config),
                "tokenizer": tokenizer_of(config["data"]),
                "seed": row["seed"],
                "val_loss": number(row.get("val/loss")),
                "attention_free_level": number(level.get("bigram")),
                **first_token(row),
                REACHED: None,
                "source": str(path),
            }
        )
    return rows


def text_studies(reports: Path) -> list[str]:
    """Every study with a runs.csv and an experiment file whose composed config trains on text."""
    names = sorted(p.parent.name for p in reports.glob("*/runs.csv"))
    return [s for s in names if is_study(s, reports) and trains_on_text(study_config(s, {}, DEFAULT_BUDGET))]


def is_study(study: str, reports: Path) -> bool:
    return (reports / study / "runs.csv").is_file() and study in study_names()


def search_table(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for column in ("n_layer", "n_head", "d_model", "block_size", "max_steps", "seed", "first_token_layer", REACHED):
        frame[column] = pd.to_numeric(frame[column]).astype("Int64")
    return frame


def settings_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per setting: runs, the first-token weight's mean and max over them, val loss mean, runs reaching 0.3."""
    measured = frame.assign(reached=frame["first_token_weight"].map(is_sink))
    grouped = measured.groupby(SETTING, dropna=False, sort=True)
    return grouped.agg(
        runs=("source", "size"),
        measured=("first_token_weight", "count"),
        weight_mean=("first_token_weight", "mean"),
        weight_max=("first_token_weight", "max"),
        val_loss_mean=("val_loss", "mean"),
        reached=("reached", "sum"),
    ).reset_index()


def verdict(settings: pd.DataFrame) -> dict:
    """How many measured settings reached 0.3, and the largest weight with its setting."""
    measured = settings[settings["measured"] > 0]
    best = measured.loc[measured["weight_max"].idxmax()] if len(measured) else None
    return {
        "reached": int((measured["reached"] > 0).sum()),
        "settings": len(measured),
        "unmeasured": len(settings) - len(measured),
        "largest": None if best is None else float(best["weight_max"]),
        "where": None if best is None else where({k: best[k] for k in SETTING}),
    }


def page(frame: pd.DataFrame, studies: list[str], run_dirs: int) -> str:
    settings = settings_table(frame)
    table = {
        "columns": [
            "corpus",
            "tokenizer",
            "layers",
            "d_model",
            "block",
            "steps",
            "bos",
            "runs",
            "first-token weight (mean)",
            "(max)",
            "val loss (mean)",
            f"reached {THRESHOLD}",
        ],
        "rows": [
            [
                *(str(s[k]) for k in SETTING),
                str(s["runs"]),
                plain(number(s["weight_mean"])),
                plain(number(s["weight_max"])),
                plain(number(s["val_loss_mean"])),
                f"{s['reached']} of {s['measured']}" if s["measured"] else "not measured",
            ]
            for _, s in settings.iterrows()
        ],
    }
    tried = {k: ", ".join(str(v) for v in sorted(frame[k].dropna().unique())) for k in TRIED}
    template = TEMPLATES.get_template("sink_search.md.j2")
    return template.render(
        threshold=THRESHOLD,
        verdict=verdict(settings),
        table=table,
        tried=tried,
        runs=len(frame),
        studies=studies,
        run_dirs=run_dirs,
    )


def write(frame: pd.DataFrame, studies: list[str], run_dirs: int, out: Path) -> None:
    atomic_write_text(out / "search.csv", frame.to_csv(index=False))
    atomic_write_text(out / "search.md", page(frame, studies, run_dirs))


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("sink-search", __doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, metavar="RUN_DIR", help="finished run dirs (results.json ok)")
    parser.add_argument(
        "--studies", help="comma-separated studies (default: every reports/<study>/runs.csv trained on text; '': none)"
    )
    parser.add_argument("--reports", type=Path, default=Path("reports"), help="where the studies are (default reports)")
    parser.add_argument("--out", type=Path, default=Path("reports/text_sinks"), help="output dir (reports/text_sinks)")
    args = parser.parse_args(argv)
    for run_dir in args.dirs:
        if not (run_dir / RESULTS).is_file():
            parser.error(f"RUN_DIR={run_dir} holds no {RESULTS}; expected a finished run dir")
        try:
            status = json.loads((run_dir / RESULTS).read_text()).get("status")
        except (ValueError, AttributeError):
            parser.error(f"RUN_DIR={run_dir}: its {RESULTS} is not a JSON object; expected a run's record")
        if status != "ok":
            parser.error(f"RUN_DIR={run_dir}: its {RESULTS} has status {status!r}; expected a finished run (ok)")
    if args.studies is None:
        studies = text_studies(args.reports)
    else:
        studies = [s for s in args.studies.split(",") if s]
        for study in studies:
            if not is_study(study, args.reports):
                parser.error(
                    f"--studies: {study} is not a study here; expected {args.reports}/{study}/runs.csv "
                    f"and conf/experiment/{study}.yaml"
                )
            data = study_config(study, {}, DEFAULT_BUDGET)["data"]
            if not trains_on_text({"data": data}):
                parser.error(f"--studies: {study} trains on {data.get('_target_')}; expected a text study")
    rows = [run_row(d) for d in args.dirs] + [row for s in studies for row in study_rows(s, args.reports)]
    frame = search_table(rows)
    write(frame, studies, len(args.dirs), args.out)
    v = verdict(settings_table(frame))
    print(f"wrote {args.out / 'search.csv'} ({len(frame)} rows) and {args.out / 'search.md'}")
    print(f"reached {THRESHOLD} in {v['reached']} of {v['settings']} settings; largest {plain(v['largest'])}")
