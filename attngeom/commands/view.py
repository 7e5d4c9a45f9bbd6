"""``attngeom view STORE --out view.html``: explore a store in a browser, one self-contained file.

The page (reports/view/page.py) needs no network and no server: open it from disk. It embeds the
chosen sequences, layers and heads (default all) and refuses, naming a selection that fits,
to grow beyond ``--max-bytes``.
"""

from __future__ import annotations

import argparse

from attngeom.common.options.commands import ViewCommand
from attngeom.common.options.spec import add_arguments
from attngeom.common.errors import Refusal


def add_parser(p: argparse.ArgumentParser) -> None:
    add_arguments(p, ViewCommand)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attngeom.reports.view import build

    out = Path(args.out)
    if not out.parent.is_dir():
        raise Refusal(f"--out {out}: folder {out.parent} does not exist; create it first")
    page = build(args.store, args.sequence, sequences=args.sequences, layers=args.layers,
                 heads=args.heads, max_bytes=args.max_bytes, cli=True)
    page.save(out)
    print(f"attngeom: wrote {out} ({page.nbytes / 1e6:.1f} MB; open it in a browser)")
    return 0
