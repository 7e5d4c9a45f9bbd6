"""``attngeom store info|validate``: inspect stores."""

from __future__ import annotations

import sys


def add_parser(p) -> None:
    sub = p.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    info = sub.add_parser("info", help="a readable summary of a store")
    info.add_argument("store")
    val = sub.add_parser("validate", help="check schema, checksums and completeness")
    val.add_argument("store")


def run(args) -> int:
    if args.store_command == "info":
        from attngeom.store.info import summary

        print(summary(args.store))
        return 0
    from attngeom.store.validate import validate

    problems = validate(args.store)
    if problems:
        for line in problems:
            print(f"attngeom: invalid store: {line}", file=sys.stderr)
        return 1
    print(f"{args.store}: valid")
    return 0
