"""Print pip constraints pinning every dependency of pyproject.toml to its lowest admitted version.

``make test-lowest`` installs the package with these constraints (plus the CPU torch the Makefile
names) into a separate virtualenv and runs the fast tests, so that the floors in pyproject.toml
are versions the suite has passed with. torch is left out (the Makefile pins the CPU build).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

SKIP = {"torch"}                       # pinned by the Makefile (the CPU build on this disk)
EXTRAS = ("test",)                     # optional dependency groups the tests need


def floors(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    specs = list(project["dependencies"])
    for extra in EXTRAS:
        specs += project["optional-dependencies"][extra]
    out = []
    for spec in specs:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*)", spec)
        name, rest = m.group(1), m.group(3)
        low = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", rest)
        if name.lower() in SKIP or low is None:
            continue
        out.append(f"{name}=={low.group(1)}")
    return out


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    print("\n".join(floors(root / "pyproject.toml")))
    sys.exit(0)
