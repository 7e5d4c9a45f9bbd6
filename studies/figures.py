"""Figures of the second study, drawn from its CSVs (PNG and PDF next to them).

- ``<prefix>_curves.png``: design 1, mean log(PPL / clean PPL) per removal fraction and metric,
  one panel per (mode, rank), error bars one standard error.
- ``<prefix>_layers.png``: design 2, per layer the mean log PPL ratio of each metric, and per step
  the mean paired improvement with its BCa 95 % CI (filled marker: the step holds after Holm over
  layers), the ±δ equivalence band shaded.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

LABEL = {"attention": "attention", "value_weighted": "value-weighted",
         "value_weighted_normalized": "value-weighted normalized", "contribution": "contribution"}
STYLE = {"attention": ("C0", "o"), "value_weighted": ("C1", "s"),
         "value_weighted_normalized": ("C2", "^"), "contribution": ("C3", "D")}


def _save(fig, results: Path, name: str) -> list[Path]:
    paths = [results / f"{name}.png", results / f"{name}.pdf"]
    for p in paths:
        fig.savefig(p, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return paths


def curves_figure(results: Path, prefix: str) -> list[Path]:
    """Design 1: loss curves of the primary outcome at every fraction."""
    c = pd.read_csv(results / f"{prefix}_curves.csv")
    c = c[c["variable"] == "log_ppl_ratio"]
    panels = [(m, r) for m in c["mode"].unique() for r in c["rank"].unique()]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for ax, (mode, rank) in zip(axes[0], panels):
        sub = c[(c["mode"] == mode) & (c["rank"] == rank)]
        for metric, g in sub.groupby("metric", sort=False):
            color, marker = STYLE.get(metric, ("k", "x"))
            g = g.sort_values("fraction")
            ax.errorbar(g["fraction"], g["loss_mean"], yerr=g["loss_sem"], color=color,
                        marker=marker, ms=4, capsize=2, label=LABEL.get(metric, metric),
                        alpha=0.6 if metric == "value_weighted_normalized" else 1.0)
        ax.set_xscale("log")
        ticks = sorted(sub["fraction"].unique())
        ax.set_xticks(ticks, [f"{p:g}" for p in ticks])
        ax.minorticks_off()
        ax.set_title(f"{mode}, {rank}", fontsize=9)
        ax.set_xlabel("fraction of keys removed (every layer)")
    axes[0][0].set_ylabel("mean log(PPL / clean PPL)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(prefix, fontsize=10)
    return _save(fig, results, f"{prefix}_curves")


def layers_figure(results: Path, prefix: str) -> list[Path]:
    """Design 2: damage per layer and metric, and each step's improvement per layer."""
    means = pd.read_csv(results / f"{prefix}_layer_means.csv")
    t = pd.read_csv(results / f"{prefix}_layers.csv")
    steps = list(dict.fromkeys(zip(t["lower"], t["higher"])))
    fig, axes = plt.subplots(1 + len(steps), 1, figsize=(7, 2.2 * (1 + len(steps))),
                             sharex=True)
    for metric, g in means.groupby("metric", sort=False):
        color, marker = STYLE.get(metric, ("k", "x"))
        axes[0].errorbar(g["layer"], g["log_ppl_ratio_mean"], yerr=g["log_ppl_ratio_sem"],
                         color=color, marker=marker, ms=3, capsize=2,
                         label=LABEL.get(metric, metric))
    axes[0].set_ylabel("mean log PPL ratio")
    axes[0].legend(fontsize=7)
    for ax, (lower, higher) in zip(axes[1:], steps):
        g = t[(t["lower"] == lower) & (t["higher"] == higher)].sort_values("layer")
        delta = float(g["delta"].iloc[0])
        ax.axhspan(-delta, delta, color="0.9", zorder=0)
        ax.axhline(0, color="0.5", lw=0.8)
        err = [g["mean_improvement"] - g["ci_low"], g["ci_high"] - g["mean_improvement"]]
        ax.errorbar(g["layer"], g["mean_improvement"], yerr=err, fmt="none", ecolor="C0",
                    capsize=2)
        held = g["verdict"] == "holds"
        ax.scatter(g["layer"][held], g["mean_improvement"][held], color="C0", zorder=3, s=14)
        ax.scatter(g["layer"][~held], g["mean_improvement"][~held], facecolor="white",
                   edgecolor="C0", zorder=3, s=14)
        ax.set_ylabel(f"{LABEL[lower]} →\n{LABEL[higher]}", fontsize=8)
    p = pd.read_csv(results / f"{prefix}_units.csv", usecols=["fraction"], nrows=1)
    axes[-1].set_xlabel("layer intervened alone (comprehensiveness, signed rank, p = "
                        f"{p['fraction'].iloc[0]:g})")
    fig.suptitle(f"{prefix}: improvement per layer (filled: holds, Holm over layers; "
                 "grey band: ±δ)", fontsize=9)
    return _save(fig, results, f"{prefix}_layers")
