"""``attngeom store info|validate|merge|subset|export|import``: inspect, join, cut and share
stores."""

from __future__ import annotations

import sys

from attngeom.common.options.commands import STORE_ACTIONS
from attngeom.common.options.spec import add_arguments
from attngeom.common.errors import Refusal


def add_parser(p) -> None:
    sub = p.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    for name, (help_text, options) in STORE_ACTIONS.items():
        add_arguments(sub.add_parser(name, help=help_text, description=help_text), options)


def run(args) -> int:
    from attngeom.store.ops.info import summary

    cmd = args.store_command
    if cmd == "info":
        print(summary(args.store))
        return 0
    if cmd == "validate":
        from attngeom.store.io.validate import validate

        problems = validate(args.store)
        if problems:
            for line in problems:
                print(f"attngeom: invalid store: {line}", file=sys.stderr)
            return 1
        print(f"{args.store}: valid")
        return 0
    if cmd == "merge":
        from attngeom.store.ops.merge import merge

        merge(args.stores, args.out, copy_files=args.copy, no_text=args.no_text)
        print(summary(args.out))
        return 0
    if cmd == "subset":
        from attngeom.store.ops.subset import added_variables, subset

        m = subset(args.store, args.out, layers=args.layers, heads=args.heads,
                   sequences=args.sequences, variables=args.variables, no_text=args.no_text)
        added = added_variables(m)
        if added:
            print(f"attngeom: also kept {', '.join(added)} (contribution is derived from them)")
        print(summary(args.out))
        return 0
    if args.store_command == "import":
        from attngeom.store.ops.hub_import import describe_import, import_export

        manifest = import_export(args.export, args.out, log=print)
        print(f"{args.out}: {describe_import(manifest)}")
        return 0
    from attngeom.store.ops.export import export

    if args.tables and args.format not in ("parquet", "hf"):
        raise Refusal("--tables applies to --format parquet and hf only")
    if args.license and args.format != "hf":
        raise Refusal("--license applies to --format hf only (the dataset card)")
    if args.format == "hf":
        from attngeom.store.ops.hub_card import check_license

        check_license(args.license)                   # before any work
    out = export(args.store, args.out, args.format, tables=args.tables, no_text=args.no_text,
                 license=args.license)
    if args.format == "hf":
        print(f"{out}: Hugging Face dataset written (card: {out}/README.md); upload it with "
              f"`hf upload USER/NAME {out} --repo-type dataset`")
    else:
        print(f"{out}: {args.format} export written (see {out}/README.txt)")
    return 0
