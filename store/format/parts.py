"""Parts of a store: ``extract --part I/N`` gives each process a contiguous block of shard files.

A store's sequences are cut into shard files of ``shard_size`` sequences in data order
(``shard-00000.nc`` holds sequences ``[0, shard_size)``, ...). ``--part I/N`` (0-based
``I``) gives process ``I`` the contiguous block of whole shard files
``[I * S // N, (I + 1) * S // N)`` of the ``S`` shards, so the N part stores hold exactly
the single-process store's shard files (same boundaries, global sequence indices, same
config and ``config_hash``: the part is recorded in the manifest's ``part``, outside the
hashed config). ``attngeom store merge`` of all N parts is the single-process store.
"""

from __future__ import annotations

import re

from attngeom.common.errors import Refusal, StoreError

PART_HELP = "use --part I/N with 0 <= I < N, e.g. --part 0/4 ... --part 3/4"


def parse_part(spec: str | tuple[int, int]) -> tuple[int, int]:
    """``"I/N"`` (or ``(I, N)``) -> ``(I, N)``; ValueError with a one-line fix otherwise."""
    if isinstance(spec, tuple):
        index, count = spec
    else:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(spec))
        if not m:
            raise Refusal(f"--part '{spec}' is not I/N; {PART_HELP}")
        index, count = int(m.group(1)), int(m.group(2))
    if not (isinstance(index, int) and isinstance(count, int)) or count < 1 \
            or not 0 <= index < count:
        raise Refusal(f"--part {index}/{count} is out of range; {PART_HELP}")
    return index, count


def shard_block(n_shards: int, index: int, count: int) -> range:
    """Indices of the shard files that part ``index`` of ``count`` extracts (contiguous)."""
    return range(index * n_shards // count, (index + 1) * n_shards // count)


def part_record(shard: tuple[int, int], n_sequences: int, shard_size: int) -> dict:
    """The manifest's ``part`` entry: which shard files and sequences this part holds
    (``shard``: ``(I, N)`` from :func:`parse_part`)."""
    index, count = shard
    n_shards = -(-n_sequences // shard_size)
    block = shard_block(n_shards, index, count)
    lo, hi = (min(n_sequences, i * shard_size) for i in (block.start, block.stop))
    return {"index": index, "count": count, "shards": [block.start, block.stop],
            "sequences": [lo, hi]}


def check_part(store, manifest: dict, part: dict | None) -> None:
    """Refuse to resume a store that was started as another part (or as the whole data)."""
    have = manifest.get("part")
    if have == part:
        return
    def name(p):
        return "the whole data" if p is None else f"--part {p['index']}/{p['count']}"
    raise StoreError(f"{store} was started with {name(have)}, not {name(part)}; "
                     "use another --out or the original --part")
