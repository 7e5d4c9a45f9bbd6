"""Page geometry, fonts and small drawing helpers shared by the report's figure modules.

Figures are built as ``matplotlib.figure.Figure`` objects (no pyplot state, so no GUI backend is
touched; the commands select Agg), one per page, A4 landscape, with the top strip left for the
section title and the bottom strip for the caption (:mod:`.documents.report` draws both). Fonts are embedded as TrueType (``pdf.fonttype: 42``) so
the text is selectable. Text from the data (tokens, captions, paths) is drawn with
``parse_math=False`` (:data:`PLAIN`) so that ``$`` prints as itself.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from attngeom.store.format import schema as S
from attngeom.store.dataset.accessor import RATIO
from attngeom.common import metrics as M

PAGE = (11.69, 8.27)                 # A4 landscape, inches
RC = {
    "pdf.fonttype": 42, "ps.fonttype": 42,
    "font.family": "DejaVu Sans", "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9,
    "legend.fontsize": 8, "xtick.labelsize": 8, "ytick.labelsize": 8,
    "figure.dpi": 100, "savefig.dpi": 150, "axes.spines.top": False,
    "axes.spines.right": False, "image.cmap": "viridis",
}
# the area figure modules draw in (figure fractions); documents/report.py adds title above,
# caption below
AREA = dict(left=0.07, right=0.96, top=0.86, bottom=0.31)
PLAIN = {"parse_math": False}
PART_COLORS = {S.ALPHA: "#4c72b0", RATIO: "#dd8452", S.COSINE: "#55a868"}
PART_LABELS = {S.ALPHA: "log α", RATIO: "log ‖ṽ‖/‖o‖", S.COSINE: "log |cos|"}


def metric_color(metric: str) -> str | None:
    """A faithfulness metric's colour, from the metric registry (None: matplotlib's next)."""
    return M.label(metric, "color") if metric in M.names() else None


def table(ax, rows, header, widths=None, title: str = "") -> None:
    """A plain table of strings filling ``ax`` (header row shaded, as tall as its most lines)."""
    ax.axis("off")
    t = ax.table(cellText=rows, colLabels=header, loc="upper center", cellLoc="center",
                 colWidths=widths)
    t.auto_set_font_size(False)
    t.set_fontsize(7.5)
    t.scale(1, 1.25)
    lines = 1 + max(str(h).count("\n") for h in header)     # a header of several lines
    for (r, _), cell in t.get_celld().items():
        cell.set_linewidth(0.3)
        if r == 0:
            cell.set_facecolor("#e8e8e8")
            cell.set_height(cell.get_height() * lines)
    ax.set_title(title, loc="left", fontsize=10)


def colormap(name: str):
    """The registered colormap ``name``: matplotlib's, or seaborn's (``rocket_r``, ``mako``...),
    which seaborn registers with matplotlib when it is imported (here, lazily)."""
    if name not in matplotlib.colormaps:
        import seaborn  # noqa: F401  registers its colormaps

    return matplotlib.colormaps[name]


@dataclass
class Page:
    """One report page: a figure (or None for a text page), its heading and its caption."""

    section: str
    title: str
    fig: Figure | None
    caption: str = ""


@contextlib.contextmanager
def style():
    """Seaborn's white-grid look and the report's rcParams, for building figures."""
    import seaborn as sns

    with matplotlib.rc_context(), sns.axes_style("whitegrid"):
        matplotlib.rcParams.update(RC)
        yield


def figure(**area) -> Figure:
    """A blank page-sized figure whose subplots fill :data:`AREA` (overridable)."""
    fig = Figure(figsize=PAGE)
    fig.subplots_adjust(**{**AREA, **area})
    return fig


def heatmap(ax, values: np.ndarray, *, cmap, vmin, vmax, rows, cols, label: str,
            marks: np.ndarray | None = None, mark_label: str = "", xlabel="head",
            ylabel="layer"):
    """A (rows x cols) heat map with a colour bar and optional markers at ``marks`` cells
    (``cmap``: a colormap or its name, matplotlib's or seaborn's)."""
    cmap = colormap(cmap) if isinstance(cmap, str) else cmap
    mesh = ax.pcolormesh(np.arange(len(cols) + 1), np.arange(len(rows) + 1), values,
                         cmap=cmap, vmin=vmin, vmax=vmax, edgecolors="white", linewidth=0.3)
    ax.set_xticks(np.arange(len(cols)) + 0.5, [str(c) for c in cols])
    step = max(1, len(rows) // 16)
    ax.set_yticks(np.arange(0, len(rows), step) + 0.5, [str(r) for r in rows[::step]])
    ax.set_xlim(0, len(cols))
    ax.set_ylim(len(rows), 0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(False)
    bar = ax.figure.colorbar(mesh, ax=ax, fraction=0.05, pad=0.02)
    bar.set_label(label)
    if marks is not None and np.any(marks):
        r, c = np.nonzero(marks)
        return ax.scatter(c + 0.5, r + 0.5, s=13, marker="o", facecolors="white",
                          edgecolors="black", linewidths=0.7, label=mark_label)
    return None


def legend_below(ax, ncol: int = 1, offset: float = 0.1, **kw) -> None:
    """The axes' legend under its x label, without a frame (none when nothing is labelled)."""
    if not ax.get_legend_handles_labels()[0]:
        return
    ax.legend(loc="upper left", bbox_to_anchor=(0, -offset), frameon=False, ncol=ncol, **kw)


def symmetric_limit(values, floor: float = 1e-3) -> float:
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    return max(floor, float(np.abs(v).max())) if v.size else 1.0


def top_layers(sinks, n: int = 4) -> list[int]:
    """The ``n`` layers with the highest mean sink rate, in layer order."""
    rate = sinks["layer_sink_rate_mean"].fillna(-np.inf).values
    pick = np.argsort(-rate, kind="stable")[:n]
    return sorted(int(sinks[S.LAYER].values[i]) for i in pick)


def note(ax, text: str) -> None:
    """Replace an empty panel by a centred line of text."""
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=9, color="0.3",
            transform=ax.transAxes)
