"""Grids of heatmap panels drawn as one image in one matplotlib Axes.

The head-type and attention-map figures are drawn at the end of every run. One Axes per panel
costs about 13 ms to build and as much again to draw (each builds its own ticks, spines and
labels): 16 panels took most of the maps' 0.36 s. Here the panels are coloured with their
colormaps, tiled into one RGBA image with gaps, and labelled with plain text, so the figure
costs one image and its texts. ``Figure`` is used without pyplot: no global figure registry.
The image is RGBA bytes, coloured as imshow would colour it (``Colormap(..., bytes=True)``,
matplotlib's own truncation to 0-255): float RGBA made Agg resample and clip a float64 copy the
size of the PNG (26 MB for a 4-layer head figure), 0.1-0.2 s the first time in a run; the pixels
are identical.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def colored(values: np.ndarray, cmap: str, vmin: float, vmax: float) -> np.ndarray:
    """(h, w) values -> (h, w, 4) RGBA bytes, as ``imshow(values, cmap, vmin, vmax)`` would colour them."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    return colormaps[cmap](Normalize(vmin, vmax)(np.asarray(values, dtype=float)), bytes=True)


def tile(panels: list[np.ndarray], cols: int, gap_x: float, gap_y: float) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Equal-shaped RGBA panels in rows of ``cols``, ``gap_x`` / ``gap_y`` transparent pixels apart:
    the image and each panel's top-left corner (x, y) in its pixel coordinates."""
    h, w = panels[0].shape[:2]
    gx, gy = int(round(gap_x)), int(round(gap_y))
    rows = -(-len(panels) // cols)
    image = np.zeros((rows * h + (rows - 1) * gy, cols * w + (cols - 1) * gx, 4), dtype=panels[0].dtype)
    corners = []
    for k, panel in enumerate(panels):
        x, y = (k % cols) * (w + gx), (k // cols) * (h + gy)
        image[y : y + h, x : x + w] = panel
        corners.append((x, y))
    return image, corners


def new_figure(width: float, height: float):
    """A Figure with an Agg canvas of its own (no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def image_axes(fig, image: np.ndarray, box: tuple[float, float, float, float]):
    """One Axes at ``box`` (left, bottom, width, height in figure fractions) showing ``image`` with
    pixel (x, y) at data (x, y), no frame and no ticks."""
    ax = fig.add_axes(box)
    ax.imshow(
        image, interpolation="nearest", aspect="auto", extent=(-0.5, image.shape[1] - 0.5, image.shape[0] - 0.5, -0.5)
    )
    ax.set_axis_off()
    return ax


def save(fig, path: Path, dpi: int) -> Path:
    """Write the PNG next to its final name and move it there, so no half-written figure is seen."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=dpi)
    tmp.replace(path)
    return path
