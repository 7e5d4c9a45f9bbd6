"""The PDF report: a title page with provenance and the summary, then one section per question.

:func:`build_report` gathers the results (:mod:`.load`), asks each module of :mod:`..figures` for its
pages, and writes them with ``PdfPages`` (TrueType fonts, selectable text, vector figures). A
section whose data is missing is left out, with a line on the title page saying why.
"""

from __future__ import annotations

import datetime as _dt
import os
import textwrap
from pathlib import Path

import numpy as np

from attngeom.store.format import schema as S
from attngeom.common.atomic import atomic_file
from attngeom.common.options.stages import AnalysisOptions

from .. import figures
from ..style import PAGE, PLAIN, Page, figure, style
from ..summary import fmt, sentences
from .load import ReportData, gather

SECTIONS = ("Faithfulness", "Sink heads", "Convexity", "Anti-alignment", "Decomposition",
            "Semantic drift", "Example sequence")
CAPTION_CHARS = 165
EXAMPLE_NEEDS = (S.ALPHA, S.CONTRIBUTION, S.CONTRIBUTION_LAYER)


# ----------------------------------------------------------------------------- sections
def section_pages(data: ReportData) -> tuple[dict[str, list[Page]], dict[str, str]]:
    """Pages per section, and for each section left out the reason."""
    a = data.analysis
    why_analysis = data.missing.get("analysis", "the analyses did not run")
    pages: dict[str, list[Page]] = {}
    left_out: dict[str, str] = {}
    if data.faith is not None:
        pages["Faithfulness"] = figures.faithfulness.pages(data.faith, data.stats)
    else:
        left_out["Faithfulness"] = data.missing["faithfulness"]
    if a is not None:
        pages["Sink heads"] = figures.sinks.pages(a["sinks"])
        pages["Convexity"] = figures.convexity.pages(data.ds, a["convexity"], a["sinks"])
        anti = a["anti_alignment"]
        if np.isfinite(anti["mean_cos"].values).any():
            pages["Anti-alignment"] = figures.anti_alignment.pages(anti, data.ds, a["sinks"])
        else:
            left_out["Anti-alignment"] = (
                f"not testable: {data.ds.sizes['sequence']} sequence(s); sequences are the "
                "replicates and the per-head tests need at least 3 (extract more texts)")
        pages["Decomposition"] = figures.decomposition.pages(a["decomposition"])
    else:
        for name in ("Sink heads", "Convexity", "Anti-alignment", "Decomposition"):
            left_out[name] = why_analysis
    if data.drift is not None:
        pages["Semantic drift"] = figures.drift.pages(data.faith, data.drift)
    else:
        left_out["Semantic drift"] = data.missing["drift"]
    lacking = [n for n in EXAMPLE_NEEDS if data.ds is None or n not in data.ds]
    if data.ds is None:
        left_out["Example sequence"] = data.missing["analysis"]
    elif lacking:
        left_out["Example sequence"] = f"the store lacks {', '.join(lacking)}"
    else:
        sinks = a["sinks"] if a else None
        pages["Example sequence"] = (figures.example.pages(data.ds, sinks)
                                     + figures.sink_strip.pages(data.ds, sinks))
    return pages, left_out


# ----------------------------------------------------------------------------- text
class Writer:
    """Lines of text going down a page, in figure coordinates."""

    def __init__(self, fig, x: float = 0.06, y: float = 0.93, width: float = 0.88):
        self.fig, self.x, self.y = fig, x, y
        self.chars_per_point = width * PAGE[0] * 72 / 0.56  # mean glyph width ~0.56 em

    def line(self, text: str, size: float = 9, gap: float = 1.4, **kw) -> None:
        self.fig.text(self.x, self.y, text, fontsize=size, va="top", **PLAIN, **kw)
        self.y -= size * gap / 72 / PAGE[1]

    def paragraph(self, text: str, size: float = 9, indent: str = "", **kw) -> None:
        width = int(self.chars_per_point / size)
        for line in textwrap.wrap(text, width, subsequent_indent=indent,
                                       break_on_hyphens=False) or [""]:
            self.line(line, size, **kw)

    def skip(self, points: float = 6) -> None:
        self.y -= points / 72 / PAGE[1]


def provenance(data: ReportData) -> list[tuple[str, str]]:
    """(label, text) rows describing where every number comes from."""
    m, ds = data.manifest, data.ds
    cfg = m["config"]
    model, d, opts = cfg["model"], cfg["data"], cfg["options"]
    if ds is None:                                  # faithfulness results only
        ds = {S.LENGTH: np.zeros(0, dtype=int)}
    lengths = np.asarray(ds[S.LENGTH])
    finite = int((ds[S.FINITE].values != 0).sum()) if S.FINITE in ds else len(lengths)
    rows = [
        ("model", f"{model['id']} ({model.get('architecture')}, {model.get('model_type')}, "
                  f"{model.get('dtype')}), {model.get('n_layers')} layers × "
                  f"{model.get('n_heads')} heads ({model.get('n_kv_heads')} kv), "
                  f"{'causal' if model.get('causal') else 'bidirectional'}"),
        ("weights", f"revision {model.get('revision') or 'n/a'}; fingerprint "
                    f"{model.get('weight_fingerprint', 'n/a')}"),
        ("data", f"{d['spec']} ({d.get('n_texts')} texts, limit {d.get('limit')}), sha256 "
                 f"{d.get('sha256')}"),
        ("sequences", f"{len(lengths)} ({finite} with finite activations), "
                      f"{int(lengths.sum()):,} tokens, {m.get('counts', {}).get('truncated', 0)} "
                      f"truncated at max_length {opts.get('max_length')}"),
        ("store", f"{data.store} — {opts.get('mode')} layout, sink k = {opts.get('sink_k')}, "
                  f"tail w = {opts.get('tail_w')}, token text "
                  f"{'kept' if opts.get('store_text', True) else 'not kept'}; content hash "
                  f"{m['config_hash'][:16]}, created {m.get('created')}"),
    ]
    if model.get("inputs") == "image":
        rows.insert(3, ("sink token", "the first token of each image: [CLS] where the model "
                        "has one (ViT, DeiT, DINOv2, CLIP); SigLIP has none, so it is the "
                        "top-left patch p(0,0). The tail is the w tokens before each query in "
                        "token order (patches row by row)."))
    if data.ds is None:
        rows = [r for r in rows if r[0] not in ("sequences", "store")] + [
            ("store", f"{data.store} — faithfulness results only (no extracted sequences); "
                      f"content hash {m['config_hash'][:16]}, created {m.get('created')}")]
    if data.analysis is not None:
        at = data.analysis["sinks"].attrs
        conv = data.analysis["convexity"].attrs
        rows.append(("analysis", f"{data.analysis_dir} — ε = {fmt(at.get('epsilon'))}, level "
                                 f"{fmt(conv.get('analysis_level'))}, bootstrap "
                                 f"{conv.get('analysis_n_boot')} resamples, seed "
                                 f"{conv.get('analysis_seed')}"))
    if data.faith is not None:
        f = data.faith
        dim = f.attrs.get("unit_dim", S.SEQUENCE)
        rows.append(("faithfulness", f"{data.faith_name}.nc — task {f.attrs.get('task')}, data "
                     f"{f.attrs.get('data')} (sha256 {str(f.attrs.get('data_sha256'))[:16]}), "
                     f"{f.sizes[dim]} {dim}s; metrics {', '.join(map(str, f['metric'].values))};"
                     f" ranks {', '.join(map(str, f['rank'].values))}; fractions "
                     f"{', '.join(fmt(p) for p in f['fraction'].values)}; granularity "
                     f"{f.attrs.get('granularity')}; layers {f.attrs.get('layers')}"))
    rows.append(("versions", "extraction: " + ", ".join(
        f"{k} {v}" for k, v in m.get("versions", {}).items()) + "; report: " + report_versions()))
    return rows


def report_versions() -> str:
    import matplotlib
    import scipy
    import seaborn
    import statsmodels
    import xarray

    from attngeom import __version__

    return ", ".join(f"{n} {v}" for n, v in (
        ("attngeom", __version__), ("matplotlib", matplotlib.__version__),
        ("seaborn", seaborn.__version__), ("scipy", scipy.__version__),
        ("statsmodels", statsmodels.__version__), ("xarray", xarray.__version__)))


def title_page(data: ReportData, contents: list[str]) -> Page:
    fig = figure()
    w = Writer(fig)
    model = data.manifest["config"]["model"]["id"]
    w.line(f"attngeom report — {model}", size=18, gap=1.5, fontweight="bold")
    w.line("Contribution weights and attention sinks (after Cunningham and Muça Cirone, "
           f"ICML 2026) · generated {_dt.date.today().isoformat()}", size=9, color="0.35")
    w.skip(8)
    w.line("Summary", size=12, fontweight="bold")
    for s in sentences(data) or ["No analysis results are available for this store."]:
        w.paragraph(s, size=9, indent="  ")
        w.skip(2)
    w.skip(6)
    w.line("Provenance", size=12, fontweight="bold")
    for label, text in provenance(data):
        w.paragraph(f"{label}: {text}", size=7.5, indent="      ")
    w.skip(6)
    w.line("Contents", size=12, fontweight="bold")
    for line in contents:
        w.paragraph(line, size=8.5, indent="      ")
    return Page("Title", "", fig)


def decorate(page: Page, number: int, total: int, model: str) -> None:
    fig = page.fig
    if page.title:
        fig.text(0.06, 0.955, page.title, fontsize=14, fontweight="bold", va="top", **PLAIN)
    fig.text(0.94, 0.985, f"attngeom · {model} · {page.section} · page {number} of {total}",
             fontsize=7, color="0.45", ha="right", va="top", **PLAIN)
    if page.caption:
        y = 0.19
        for line in textwrap.wrap(page.caption, CAPTION_CHARS, break_on_hyphens=False):
            fig.text(0.06, y, line, fontsize=8.5, va="top", **PLAIN)
            y -= 8.5 * 1.4 / 72 / PAGE[1]


# ----------------------------------------------------------------------------- build
def render(data: ReportData, out: str | os.PathLike) -> Path:
    """Write the report of ``data`` to ``out`` (atomically); return its path."""
    from matplotlib.backends.backend_pdf import PdfPages

    out = Path(out)
    model = data.manifest["config"]["model"]["id"]
    with style():
        by_section, left_out = section_pages(data)
        contents, number = [], 2
        for name in SECTIONS:
            if name in by_section:
                n = len(by_section[name])
                contents.append(f"{name}: page{'s' if n > 1 else ''} {number}"
                                + (f"–{number + n - 1}" if n > 1 else ""))
                number += n
            else:
                contents.append(f"{name}: left out — {left_out[name]}")
        pages = [title_page(data, contents)]
        pages += [p for name in SECTIONS for p in by_section.get(name, [])]
        meta = {"Title": f"attngeom report: {model}", "Author": "attngeom",
                "Subject": "contribution weights and attention sinks",
                "Keywords": f"store {data.manifest['config_hash'][:16]}"}
        with atomic_file(out) as tmp, PdfPages(tmp, metadata=meta) as pdf:
            for i, page in enumerate(pages, 1):
                decorate(page, i, len(pages), model)
                pdf.savefig(page.fig)
    return out


def build_report(store: str | os.PathLike, out: str | os.PathLike | None = None,
                 analysis_dir: str | os.PathLike | None = None, *,
                 faithfulness: str = "faithfulness", progress: bool = True, log=print,
                 options: AnalysisOptions | None = None) -> Path:
    """Run the missing analyses and write the PDF report of ``store``.

    Parameters
    ----------
    store : str or os.PathLike
        The store directory.
    out : str or os.PathLike, optional
        The PDF path (default ``<store>/report.pdf``).
    analysis_dir : str or os.PathLike, optional
        Analysis results (default ``<store>/analysis``; computed when missing).
    faithfulness : str
        Name of the recorded faithfulness result to show.
    progress : bool
        Show progress bars while the analyses run.
    log : callable
        Receives the lines the command prints (default: print).
    options : AnalysisOptions, optional
        The analysis options (:class:`attngeom.common.options.stages.AnalysisOptions`), used
        when the analyses run.

    Returns
    -------
    Path
        The PDF's path.
    """
    data = gather(store, analysis_dir, faithfulness=faithfulness, progress=progress, log=log,
                  options=options)
    out = Path(out) if out is not None else Path(store) / "report.pdf"
    return render(data, out)


__all__ = ["build_report", "render", "SECTIONS"]
