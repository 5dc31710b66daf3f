"""Head-analysis outputs in a run dir: heads.json (for results.json), heads.md, heads.png."""
from __future__ import annotations

import json
from pathlib import Path

from ..markdown import markdown_table
from ..results import atomic_write_text
from .heads import SCORES, THRESHOLDS, TYPES

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
    counts = [[layer, *(sum(h["type"] == t for h in heads if h["layer"] == layer) for t in TYPES)] for layer in range(n_layer)]
    lines += [markdown_table(table_columns(heads), scores), "", "Types per layer:", "", markdown_table(["layer", *TYPES], counts)]
    if "repeat_acc" in summary:
        lines += ["", f"Accuracy of copying the repeated probe: {summary['repeat_acc']:.3f}"]
    layer_drops = [f"L{layer} {summary[key]:.3f}" for layer in range(n_layer) if (key := f"L{layer}/induction_knockout_all_heads") in summary]
    if layer_drops:
        lines += ["", "Induction knockout with every head of a layer cut at once: " + ", ".join(layer_drops)]
    rules = ", ".join(f"{k} >= {v}" for k, v in THRESHOLDS.items()).replace("induction >=", "induction - induction_control >=")
    lines += [
        "",
        f"Type = the first rule that holds, in this order: {rules} (uniform: entropy_norm); else content. "
        "Scores are defined in `attnlab.analysis.heads`.",
        "",
    ]
    return "\n".join(lines)


def plot_heads(heads: list[dict], path: Path, title: str = "") -> None:
    """One layer x head heatmap per score, annotated, plus a panel of the types."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    n_layer = max(h["layer"] for h in heads) + 1
    n_head = max(h["head"] for h in heads) + 1
    names = score_names(heads)
    panels = len(names) + 1
    width, height = 2.2 + 0.55 * n_head * panels, 1.2 + 0.5 * n_layer
    fig, axes = plt.subplots(1, panels, figsize=(width, height), squeeze=False)
    for ax, name in zip(axes[0], names):
        grid = np.zeros((n_layer, n_head))
        for h in heads:
            grid[h["layer"], h["head"]] = h["scores"][name]
        ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="w" if v < 0.6 else "k")
        ax.set_title(name, fontsize=9)
    ax = axes[0][-1]
    codes = np.zeros((n_layer, n_head))
    for h in heads:
        codes[h["layer"], h["head"]] = TYPES.index(h["type"])
    ax.imshow(codes, vmin=0, vmax=len(TYPES) - 1, cmap="tab10", aspect="auto")
    for h in heads:
        ax.text(h["head"], h["layer"], h["type"].replace("_token", "")[:6], ha="center", va="center", fontsize=6)
    ax.set_title("type", fontsize=9)
    for ax in axes[0]:
        ax.set_xticks(range(n_head))
        ax.set_yticks(range(n_layer))
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.tick_params(labelsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    # margins in inches (tick labels, axis labels, titles): fixed, because tight_layout would draw the
    # figure twice (about 0.4 s of a run's end, reports/bench)
    fig.subplots_adjust(left=0.45 / width, right=1 - 0.1 / width, bottom=0.45 / height, top=1 - 0.6 / height,
                        wspace=0.45)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def write_outputs(
    heads: list[dict], summary: dict, out_dir: Path, history: list[dict] | None = None, meta: dict | None = None,
    title: str = "Head types", plot: bool = True,
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
