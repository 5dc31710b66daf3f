"""The committed mechanism studies that claims 12 and 13 cite, read back from their reports.

Claim 8 (training fails without scaling) is answered by the dk_scaling study (d_k x scaling x init,
several seeds, 2000 steps: runs that are well below the attention-free level), read the same way.
Claims 12 (head types) and 13 (attention sinks) are about mechanisms a short text run does not
form. The settings in which they can form are studies of their own (``make sweep
SWEEP=induction_heads`` / ``SWEEP=sinks``, several seeds, minutes each), so ``make repro`` does not
retrain them: it reads ``reports/<study>/ablation.csv`` (mean and std over seeds per cell) and
``summary.json`` (head types per layer and seed), both written by ``make report``, and cites them.
A missing report leaves that part of the claim untested, and says which command produces it.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from attnlab.attention.masks import Visibility
from attnlab.attention.stats import uniform_sink_mass
from attnlab.repro.judge import BB_BASE, BB_GATE, BB_SGD, BB_SIGMOID, BB_SLOTS, BB_WINDOW, BB_WINDOW_SIZE
from attnlab.util.significance import holm

INDUCTION, SINKS, DK_SCALING, SINKS_BB = "induction_heads", "sinks", "dk_scaling", "sinks_bb"
# the arms trained after the merged report, each a report of its own: (report, axes of its cell) -> arm
BB_OWN_REPORTS = {
    ("sinks_bb_gate", ()): BB_GATE,
    ("sinks_bb_window", (("model.attention.window_sinks", "0"),)): BB_WINDOW[0],
    ("sinks_bb_window", (("model.attention.window_sinks", "1"),)): BB_WINDOW[1],
}
BB_METRICS = {
    "dormant": "attn/L0/sink_mass_dormant",
    "active": "attn/L0/sink_mass_active",
    "escape": "attn/L0/escape_mass",
    "row_mass": "attn/L0/row_mass",
    "value_drain": "attn/L0/value_drain",
    "copy_acc": "val/copy/acc",
    "max_prob": "attn/L0/max_prob",
    "entropy_norm": "attn/L0/entropy_norm",
    "val_loss": "val/loss",
}
BB_ARMS = {
    ("sinks_bb", "none", "softmax"): BB_BASE,
    ("sinks_bb", "zero_logit", "softmax"): BB_SLOTS[0],
    ("sinks_bb", "learned", "softmax"): BB_SLOTS[1],
    ("sinks_bb_sgd", "none", "softmax"): BB_SGD,
    ("sinks_bb", "none", "sigmoid"): BB_SIGMOID,
}


def study_cells(reports: Path, study: str) -> list[dict] | None:
    """The rows of ``reports/<study>/ablation.csv`` as {column: value}; None when there is none."""
    path = Path(reports) / study / "ablation.csv"
    if not path.is_file():
        return None
    with path.open(newline="") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _number(text: str):
    """A CSV cell as the number it holds, else as text ('' as None)."""
    if text == "":
        return None
    try:
        return float(text)
    except ValueError:
        return text


def study_head_types(reports: Path, study: str, axes: dict) -> list[dict[str, list[int]]] | None:
    """The head types per layer ({type: heads per seed}) of the cell with these axes, from
    ``reports/<study>/summary.json``; None when the report or the cell has none."""
    path = Path(reports) / study / "summary.json"
    if not path.is_file():
        return None
    for cell in json.loads(path.read_text()).get("head_types", []):
        if all(cell["axes"].get(k, str(v)) == str(v) for k, v in axes.items()):
            return cell["layers"] if any(cell["layers"]) else None
    return None


def _cell(cells: list[dict], axes: dict) -> dict | None:
    """The cell whose axis columns read as the given override values (an axis the sweep held fixed
    has no column, and matches)."""
    return next((c for c in cells if all(k not in c or _axis_text(c[k]) == str(v) for k, v in axes.items())), None)


def _axis_text(value) -> str:
    """An axis value as it was swept: 2.0 read back from the CSV is the override 2."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _stat(cell: dict, key: str) -> dict | None:
    mean = cell.get(f"{key}_mean")
    return None if mean is None else {"mean": mean, "std": cell.get(f"{key}_std") or 0.0}


TWO_LAYER = {"model.n_layer": 2, "model.attention.scaling": "inv_sqrt_d"}
ONE_LAYER = {"model.n_layer": 1, "model.attention.scaling": "inv_sqrt_d"}


def induction_measurements(reports: Path) -> dict | None:
    """The induction circuit in the study's scaled cells: per layer the head types, layer 0's best
    previous-token head, layer 1's best induction head against the best control score and the
    knockout of layer 1's induction edges (2 layers), and the 1-layer model's best induction head.
    None without the report (or with one written before these columns existed)."""
    cells = study_cells(reports, INDUCTION)
    two = _cell(cells or [], TWO_LAYER)
    if two is None or _stat(two, "heads/L1/induction_max") is None:
        return None
    keys = {
        "previous_token_L0": "heads/L0/previous_token_max",
        "induction_L1": "heads/L1/induction_max",
        "control": "heads/induction_control_max",
        "knockout_L1": "heads/L1/induction_knockout_all_heads",
        "repeat_acc": "heads/repeat_acc",
    }
    two_layer = {
        "types": study_head_types(reports, INDUCTION, TWO_LAYER),
        **{k: _stat(two, c) for k, c in keys.items()},
    }
    out = {"source": f"reports/{INDUCTION}", "seeds": int(two["n_ok"]), "two_layer": two_layer}
    one = _cell(cells, ONE_LAYER)
    if one is not None:
        out["one_layer"] = {
            "induction_L0": _stat(one, "heads/L0/induction_max"),
            "repeat_acc": _stat(one, "heads/repeat_acc"),
        }
    return out


def escape_axis(axes: dict) -> str:
    """The escape slot's axis in a study's cells: ``model.attention.escape``, or its old name in a
    report written before the rename."""
    return "model.attention.escape" if "model.attention.escape" in axes else "model.attention.sink"


def sinks_measurements(reports: Path, uniform: float) -> dict | None:
    """Per (data.bos, model.attention.escape) cell: the seeds, each layer's head types, best sink
    head, sink mass and escape mass. ``uniform``: the sink mass of uniform attention at the study's
    block size. None without the report."""
    cells = study_cells(reports, SINKS)
    if not cells or "heads/L0/sink_max_mean" not in cells[0]:
        return None
    layers = sum(f"heads/L{i}/sink_max_mean" in cells[0] for i in range(len(cells[0])))
    out = {"source": f"reports/{SINKS}", "uniform": uniform, "cells": {}}
    for cell in cells:
        axes = {k: cell[k] for k in ("data.bos", escape_axis(cell))}
        templates = {
            "sink_max": "heads/L{i}/sink_max",
            "sink_mass": "attn/L{i}/sink_mass",
            "escape_mass": "attn/L{i}/escape_mass",
        }
        per_layer = {name: [cell.get(f"{t.format(i=i)}_mean") for i in range(layers)] for name, t in templates.items()}
        key = f"bos={str(cell['data.bos']).lower()}, sink={cell[escape_axis(cell)]}"
        out["cells"][key] = {"seeds": int(cell["n_ok"]), "types": study_head_types(reports, SINKS, axes), **per_layer}
    return out


def _bb_arm(cell: dict) -> dict:
    """One testbed arm from a summary.json per_seed cell: its seeds and every seed's final values."""
    return {
        "seeds": [r["seed"] for r in cell["runs"]],
        **{key: [r["metrics"].get(metric) for r in cell["runs"]] for key, metric in BB_METRICS.items()},
    }


def _window_levels(block_size: int, sinks: int) -> dict:
    """Uniform attention's first-token weight in the window arms' window, and the most the statistic can read there
    (every query that sees the first token putting all its weight on it): the share of the counted queries that see it."""

    visibility = Visibility(True, BB_WINDOW_SIZE, sinks)
    seen = visibility.mask(block_size, block_size)[0, 0]
    counted = seen.sum(-1) > 1
    return {
        "window": BB_WINDOW_SIZE,
        "window_sinks": sinks,
        "uniform": uniform_sink_mass(block_size, visibility),
        "ceiling": float(seen[counted, 0].double().mean()),
        "queries_seeing": int(seen[counted, 0].sum()),
        "queries": int(counted.sum()),
    }


def sinks_bb_measurements(reports: Path, uniform: float, block_size: int | None = None) -> dict | None:
    """The Bigram-Backcopy testbed (experiment=sinks_bb, + sinks_bb_sgd): per arm, every seed's final
    first-token weight from dormant and from active queries, escape mass, value drain, copy accuracy, max_prob,
    entropy_norm and val loss, from ``reports/sinks_bb/summary.json``'s per-seed values; with the arms of
    ``reports/sinks_bb_gate`` and ``reports/sinks_bb_window`` (BB_OWN_REPORTS) where those exist. ``uniform``:
    uniform attention's first-token weight at the testbed's block size; ``block_size`` gives each window arm its
    own level and ceiling (``window_loss``: the window report's val-loss contrast). None without the report."""
    path = Path(reports) / SINKS_BB / "summary.json"
    if not path.is_file():
        return None
    arms = {}
    for cell in json.loads(path.read_text()).get("per_seed", []):
        axes = cell["axes"]
        normalize = (
            "sigmoid" if axes.get("model.attention.normalize") == "sigmoid" else "softmax"
        )  # absent: the default
        name = BB_ARMS.get((axes.get("experiment", SINKS_BB), axes.get(escape_axis(axes), "none"), normalize))
        if name is None or not cell["runs"]:
            continue
        arms[name] = _bb_arm(cell)
    out = {"source": f"reports/{SINKS_BB}", "uniform": uniform, "arms": arms}
    for study in dict.fromkeys(study for study, _ in BB_OWN_REPORTS):
        own = Path(reports) / study / "summary.json"
        if not own.is_file():
            continue
        summary = json.loads(own.read_text())
        for cell in summary.get("per_seed", []):
            name = BB_OWN_REPORTS.get((study, tuple(sorted((k, str(v)) for k, v in cell["axes"].items()))))
            if name is None or not cell["runs"]:
                continue
            arms[name] = {**_bb_arm(cell), "source": f"reports/{study}"}
            if name in BB_WINDOW and block_size is not None:
                arms[name].update(_window_levels(block_size, BB_WINDOW.index(name)))
        if study == "sinks_bb_window":
            contrast = next(iter(summary.get("contrasts", {}).get("val/loss", [])), None)
            if contrast is not None:
                out["window_loss"] = {k: contrast.get(k) for k in ("diff", "ci95", "p_holm", "beyond_noise")}
    return out if arms else None


def dk_scaling_measurements(reports: Path) -> dict | None:
    """Per (init_std, d_k): the unscaled and scaled cells' final val loss (mean, std, seeds), the Welch p of
    the pair and its Holm-corrected p over the study's pairs (recomputed from the raw p when the summary
    predates it), and the seed ids when the summary lists them. None without the report."""
    cells = study_cells(reports, DK_SCALING)
    path = Path(reports) / DK_SCALING / "summary.json"
    if not cells or not path.is_file():
        return None
    summary = json.loads(path.read_text())
    pairs = summary.get("scaled_vs_unscaled", [])
    adjusted = holm([p.get("p") for p in pairs])
    pairs = [
        {
            **p,
            "p_holm": p.get("p_holm", adj),
            "at": dict(kv.split("=", 1) for kv in p["where"].split(", ") if "=" in kv),
        }
        for p, adj in zip(pairs, adjusted)
    ]
    seeds = sorted({r["seed"] for c in summary.get("per_seed", []) for r in c["runs"]}, key=str)
    out = {
        "source": f"reports/{DK_SCALING}",
        "seeds": summary.get("seeds_per_cell"),
        "seed_ids": seeds or None,
        "cells": [],
    }
    # an axis the sweep held fixed has no column: one value, named by the run config it does not record here
    inits = (
        list(dict.fromkeys(_axis_text(c["model.init_std"]) for c in cells)) if "model.init_std" in cells[0] else ["-"]
    )
    d_ks = sorted({int(c["model.d_k"]) for c in cells}) if "model.d_k" in cells[0] else ["-"]
    for init in inits:
        for d_k in d_ks:
            axes = {k: v for k, v in (("model.init_std", init), ("model.d_k", d_k)) if v != "-"}
            unscaled, scaled = (_cell(cells, {**axes, "model.attention.scaling": s}) for s in ("none", "inv_sqrt_d"))
            if unscaled is None or scaled is None:
                continue
            pair = next(
                (p for p in pairs if all(p["at"].get(k.rsplit(".", 1)[-1], str(v)) == str(v) for k, v in axes.items())),
                {},
            )
            out["cells"].append(
                {
                    "init_std": init,
                    "d_k": d_k,
                    "p": pair.get("p"),
                    "p_holm": pair.get("p_holm"),
                    **{
                        k: {**_stat(c, "val/loss"), "n": int(c["n_ok"])}
                        for k, c in (("unscaled", unscaled), ("scaled", scaled))
                    },
                }
            )
    return out
