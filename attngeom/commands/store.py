"""``attngeom store info|validate|merge|subset|export|import``: inspect, join, cut and share
stores."""

from __future__ import annotations

import sys


def add_parser(p) -> None:
    sub = p.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    info = sub.add_parser("info", help="a readable summary of a store (provenance, content "
                                       "hash, layout, faithfulness results)")
    info.add_argument("store", help="store directory")
    val = sub.add_parser("validate", help="check schema, checksums and completeness")
    val.add_argument("store", help="store directory")

    merge = sub.add_parser(
        "merge", help="join stores of the same model and options (e.g. the parts of "
                      "extract --shard I/N) into one")
    merge.add_argument("stores", nargs="+", metavar="STORE",
                       help="input stores (parts of one sharded run, or stores of other data)")
    merge.add_argument("--out", required=True, help="new store directory")
    merge.add_argument("--copy", action="store_true",
                       help="copy shard files instead of hard-linking them")
    merge.add_argument("--no-text", action="store_true", help="leave token strings out")

    cut = sub.add_parser("subset", help="a smaller store: some layers, heads, sequences, "
                                        "variables")
    cut.add_argument("store", help="store directory")
    cut.add_argument("--out", required=True, help="new store directory")
    cut.add_argument("--layers", help="layer numbers, e.g. 0:4,7 (half-open ranges)")
    cut.add_argument("--heads", help="head numbers, e.g. 0:8")
    cut.add_argument("--sequences", help="sequence indices, e.g. 0:100 (renumbered 0..n-1)")
    cut.add_argument("--variables", help="comma-separated names, e.g. alpha,value_norm "
                                         "(what contribution needs to derive is kept too)")
    cut.add_argument("--no-text", action="store_true", help="leave token strings out")

    exp = sub.add_parser("export", help="Zarr (cloud storage), Parquet long tables (R, "
                                        "pandas) or a Hugging Face dataset repository")
    exp.add_argument("store", help="store directory")
    exp.add_argument("--format", required=True, choices=["zarr", "parquet", "hf"],
                     help="zarr, parquet, or hf (Parquet shards + dataset card for the Hub)")
    exp.add_argument("--out", required=True, help="new directory (.zarr, tables, dataset)")
    exp.add_argument("--tables", help="parquet and hf: comma-separated subset of per_query, "
                                      "per_key, pairs, sequences, tokens (default all)")
    exp.add_argument("--license", help="hf only: the dataset card's license identifier, e.g. "
                                       "mit, cc-by-4.0 (default unknown)")
    exp.add_argument("--no-text", action="store_true", help="leave token strings out")

    imp = sub.add_parser("import", help="rebuild a store from a --format hf export (a Hub "
                                        "dataset as `hf download` leaves it)")
    imp.add_argument("export", help="the export's folder (with manifest.source.json)")
    imp.add_argument("--out", required=True, help="new store directory")


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
        raise ValueError("--tables applies to --format parquet and hf only")
    if args.license and args.format != "hf":
        raise ValueError("--license applies to --format hf only (the dataset card)")
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
