"""Opening refuses what it cannot trust; ``store validate`` finds every kind of damage.

Each test damages a private copy of a session store (llama, compact, 2 shards) and checks
``attngeom.store.io.validate.validate`` and the CLI's exit status (``attngeom store validate``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import attngeom.store
from attngeom.cli import main
from attngeom.store.ops.info import summary
from attngeom.store.errors import StoreError
from attngeom.store.io.validate import validate

SHARD0, SHARD1 = "shards/shard-00000.nc", "shards/shard-00001.nc"


def _edit_manifest(store: Path, edit) -> None:
    path = store / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))


def _flip_middle(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    for i in range(len(raw) // 2, len(raw) // 2 + 8):
        raw[i] ^= 0xA5
    path.write_bytes(bytes(raw))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _cli_validate(store: Path, capsys) -> tuple[int, str, str]:
    rc = main(["store", "validate", str(store)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_sound_store_is_valid(copy_store, capsys):
    store = copy_store()
    assert validate(store) == []
    rc, out, err = _cli_validate(store, capsys)
    assert rc == 0 and "valid" in out and err == ""


DAMAGE = {
    "flipped bytes": (lambda s: _flip_middle(s / SHARD1), "checksum mismatch"),
    "truncated shard": (lambda s: _truncate(s / SHARD0), "checksum mismatch"),
    "deleted shard": (lambda s: (s / SHARD1).unlink(), "missing"),
    "manifest checksum edited": (
        lambda s: _edit_manifest(s, lambda m: m["shards"][0].update(sha256="0" * 64)),
        "checksum mismatch"),
    "manifest shard entry dropped": (
        lambda s: _edit_manifest(s, lambda m: m["shards"].pop()), "in no shard"),
    "manifest sequence count edited": (
        lambda s: _edit_manifest(s, lambda m: m.update(n_sequences=7)), "[5, 7)"),
    "manifest sequence range edited": (
        lambda s: _edit_manifest(s, lambda m: m["shards"][1].update(sequences=[3, 6])),
        "sequence coordinate"),
    "manifest options edited": (
        lambda s: _edit_manifest(s, lambda m: m["config"]["options"].update(tail_w=5)),
        "config"),
    "manifest marked incomplete": (
        lambda s: _edit_manifest(s, lambda m: m.update(complete=False)), "incomplete"),
    "manifest shard path leaves the store": (
        lambda s: _edit_manifest(s, lambda m: m["shards"][0].update(file="../elsewhere.nc")),
        "leaves the store"),
    "manifest not JSON": (
        lambda s: (s / "manifest.json").write_text('{"format": "attngeom-store", '),
        "damaged manifest"),
    "manifest deleted": (lambda s: (s / "manifest.json").unlink(), "manifest.json"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_validate_catches_damage(damage, copy_store, capsys):
    store = copy_store()
    act, needle = DAMAGE[damage]
    act(store)
    problems = validate(store)
    assert problems and any(needle in p for p in problems), problems
    rc, out, err = _cli_validate(store, capsys)
    assert rc != 0
    lines = err.strip().splitlines()
    assert lines and all(line.startswith("attngeom: invalid store: ") for line in lines)
    assert "Traceback" not in err


def test_validate_catches_a_shard_from_another_store(copy_store, stores):
    """A shard of the same layout but other settings (another model), checksum updated."""
    from attngeom.store.format.manifest import file_sha256

    store = copy_store("llama", "compact")
    foreign = stores["bert", "compact"] / SHARD0
    (store / SHARD0).write_bytes(foreign.read_bytes())
    _edit_manifest(store, lambda m: m["shards"][0].update(sha256=file_sha256(foreign)))
    assert any("other settings" in p for p in validate(store))


def test_open_refuses_incomplete_store(copy_store):
    store = copy_store()
    _edit_manifest(store, lambda m: m.update(complete=False))
    with pytest.raises(StoreError) as info:
        attngeom.store.open(store)
    assert "incomplete" in str(info.value) and "\n" not in str(info.value)
    assert attngeom.store.open(store, partial=True).sizes["sequence"] == 5
    assert "INCOMPLETE" in summary(store)


@pytest.mark.parametrize("damage", ["deleted shard", "truncated shard", "manifest not JSON",
                                    "manifest deleted"])
def test_open_refuses_damaged_store(damage, copy_store):
    store = copy_store()
    DAMAGE[damage][0](store)
    with pytest.raises(StoreError) as info:
        attngeom.store.open(store)
    assert "\n" not in str(info.value)


def test_open_refuses_other_schema_version_and_non_store(copy_store, tmp_path):
    store = copy_store()
    _edit_manifest(store, lambda m: m.update(schema_version=99))
    with pytest.raises(StoreError, match="schema version"):
        attngeom.store.open(store)
    with pytest.raises(StoreError, match="not a store directory"):
        attngeom.store.open(tmp_path / "nowhere")


def test_info_summary(stores, layout):
    text = summary(stores["llama", "compact"])
    assert "complete: 5 of 5 sequences in 2 shard(s)" in text
    assert f"compact (sink k={layout['sink_k']}, tail w={layout['tail_w']}" in text
    assert "llama" in text and "2 layers x 4 heads (2 kv), causal" in text
    assert "1 truncated" in text
