"""``attngeom view STORE --out view.html``: explore a store in a browser, one self-contained file.

The page (reports/view/page.py) needs no network and no server: open it from disk. It embeds the
chosen sequences, layers and heads (default all) and refuses, naming a selection that fits,
to grow beyond ``--max-bytes``.
"""

from __future__ import annotations

import argparse

from attngeom.common.options.ranges import SYNTAX
from attngeom.common.vocab import VIEW_MAX_BYTES


def _bytes(text: str) -> int:
    units = {"kb": 10**3, "mb": 10**6, "gb": 10**9}
    t = text.strip().lower()
    mult = next((v for u, v in units.items() if t.endswith(u)), 1)
    try:
        value = int(float(t[:-2] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (e.g. 25000000 or 25MB)")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' must be positive")
    return value


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", help="store directory")
    p.add_argument("--out", required=True, help="the HTML file to write (e.g. view.html)")
    p.add_argument("--sequences", help=f"sequences to embed (default all): {SYNTAX}")
    p.add_argument("--layers", help="layers to embed (default all), e.g. 0:4,7")
    p.add_argument("--heads", help="heads to embed (default all), e.g. 0:8")
    p.add_argument("--sequence", type=int, default=None,
                   help="the sequence shown first (default the first embedded)")
    p.add_argument("--max-bytes", type=_bytes, default=VIEW_MAX_BYTES,
                   help=f"refuse a page larger than this (default {VIEW_MAX_BYTES // 10**6}MB)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attngeom.reports.view import build

    out = Path(args.out)
    if not out.parent.is_dir():
        raise ValueError(f"--out {out}: folder {out.parent} does not exist; create it first")
    page = build(args.store, args.sequence, sequences=args.sequences, layers=args.layers,
                 heads=args.heads, max_bytes=args.max_bytes, cli=True)
    page.save(out)
    print(f"attngeom: wrote {out} ({page.nbytes / 1e6:.1f} MB; open it in a browser)")
    return 0
