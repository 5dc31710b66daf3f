"""Head-analysis outputs in a run dir: heads.json (for results.json), heads.md, heads.png."""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.analysis.heads import SCORES, THRESHOLDS, TYPES
from attnlab.analysis.panels import colored, image_axes, new_figure, save, tile
from attnlab.util.files import atomic_write_text
from attnlab.writing.markdown import markdown_table

HEADS_JSON, HEADS_MD, HEADS_PNG = "heads.json", "heads.md", "heads.png"


def score_names(heads: list[dict]) -> list[str]:
    """The scores these heads carry, in SCORES order (induction_knockout is optional)."""
    return [s for s in SCORES if s in heads[0]["scores"]]


def table_columns(heads: list[dict]) -> list[str]:
    return ["layer", "head", "type", *score_names(heads)]


def table_rows(heads: list[dict]) -> list[list]:
    """One row per head in table_columns order (for the W&B Table and the Markdown)."""
    names = score_names(heads)
    return [[h["layer"], h["head"], h["type"], *(h["scores"][s] for s in names)] for h in heads]


def heads_markdown(heads: list[dict], summary: dict, title: str = "Head types", note: str = "") -> str:
    n_layer = max(h["layer"] for h in heads) + 1
    lines = [f"# {title}", ""]
    if note:
        lines += [note, ""]
    scores = [[f"{v:.3f}" if isinstance(v, float) else v for v in row] for row in table_rows(heads)]
    counts = [
        [layer, *(sum(h["type"] == t for h in heads if h["layer"] == layer) for t in TYPES)] for layer in range(n_layer)
    ]
    lines += [
        markdown_table(table_columns(heads), scores),
        "",
        "Types per layer:",
        "",
        markdown_table(["layer", *TYPES], counts),
    ]
    if "repeat_acc" in summary:
        lines += ["", f"Accuracy of copying the repeated probe: {summary['repeat_acc']:.3f}"]
    layer_drops = [
        f"L{layer} {summary[key]:.3f}"
        for layer in range(n_layer)
        if (key := f"L{layer}/induction_knockout_all_heads") in summary
    ]
    if layer_drops:
        lines += ["", "Induction knockout with every head of a layer cut at once: " + ", ".join(layer_drops)]
    rules = ", ".join(f"{k} >= {v}" for k, v in THRESHOLDS.items()).replace(
        "induction >=", "induction - induction_control >="
    )
    lines += [
        "",
        f"Type = the first rule that holds, in this order: {rules} (uniform: entropy_norm); else content. "
        "Scores are defined in `attnlab.analysis.heads`.",
        "",
    ]
    return "\n".join(lines)


def plot_heads(heads: list[dict], path: Path, title: str = "") -> None:
    """One layer x head heatmap per score, annotated, plus a panel of the types (one image, one
    Axes: ``analysis.panels``). Cells are 0.55 x 0.5 in, panels one cell apart."""
    import numpy as np

    n_layer = max(h["layer"] for h in heads) + 1
    n_head = max(h["head"] for h in heads) + 1
    names = score_names(heads)
    grids = {name: np.zeros((n_layer, n_head)) for name in names}
    codes = np.zeros((n_layer, n_head))
    for h in heads:
        for name in names:
            grids[name][h["layer"], h["head"]] = h["scores"][name]
        codes[h["layer"], h["head"]] = TYPES.index(h["type"])
    panels = [colored(grids[name], "viridis", 0, 1) for name in names] + [colored(codes, "tab10", 0, len(TYPES) - 1)]
    image, corners = tile(panels, len(panels), 1, 0)
    cell_w, cell_h, left, right, bottom, top = 0.55, 0.5, 0.45, 0.1, 0.45, 0.6  # inches
    width, height = left + right + cell_w * image.shape[1], bottom + top + cell_h * n_layer
    fig = new_figure(width, height)
    ax = image_axes(
        fig, image, (left / width, bottom / height, 1 - (left + right) / width, 1 - (bottom + top) / height)
    )
    text = dict(ha="center", va="center", clip_on=False)
    for (x0, _), name in zip(corners, [*names, "type"]):
        ax.text(x0 + (n_head - 1) / 2, -0.5 - 0.1 / cell_h, name, fontsize=9, **{**text, "va": "bottom"})
        ax.text(x0 + (n_head - 1) / 2, n_layer - 0.5 + 0.3 / cell_h, "head", fontsize=8, **{**text, "va": "top"})
        for j in range(n_head):
            ax.text(x0 + j, n_layer - 0.5 + 0.05 / cell_h, str(j), fontsize=7, **{**text, "va": "top"})
    for i in range(n_layer):
        ax.text(-0.5 - 0.05 / cell_w, i, str(i), fontsize=7, **{**text, "ha": "right"})
    ax.text(-0.5 - 0.3 / cell_w, (n_layer - 1) / 2, "layer", fontsize=8, rotation=90, **{**text, "ha": "right"})
    for (x0, _), name in zip(corners, names):
        for (i, j), v in np.ndenumerate(grids[name]):
            ax.text(x0 + j, i, f"{v:.2f}", fontsize=7, color="w" if v < 0.6 else "k", **text)
    for h in heads:
        ax.text(corners[-1][0] + h["head"], h["layer"], type_label(h["type"]), fontsize=5.5, **text)
    if title:
        fig.suptitle(title, fontsize=10)
    save(fig, path, dpi=110)


def type_label(head_type: str) -> str:
    """A head type's label in the type panel: the whole name, broken at its underscore to fit a cell."""
    return head_type.replace("_", "\n")


def write_outputs(
    heads: list[dict],
    summary: dict,
    out_dir: Path,
    history: list[dict] | None = None,
    meta: dict | None = None,
    title: str = "Head types",
    plot: bool = True,
) -> dict[str, Path]:
    """Write heads.json ({"heads", "summary", "history", "probe"}), heads.md and heads.png."""
    out_dir = Path(out_dir)
    paths = {"json": out_dir / HEADS_JSON, "md": out_dir / HEADS_MD}
    data = {"heads": heads, "summary": summary, "history": history or [], "probe": meta or {}}
    atomic_write_text(paths["json"], json.dumps(data, indent=2))
    note = ""
    if meta:
        note = "Probe: " + ", ".join(f"{k}={v}" for k, v in meta.items())
    atomic_write_text(paths["md"], heads_markdown(heads, summary, title, note))
    if plot:
        paths["png"] = out_dir / HEADS_PNG
        plot_heads(heads, paths["png"], title)
    return paths
