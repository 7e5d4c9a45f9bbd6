"""Growing past one machine: ``extract --shard I/N`` slices and dask.distributed schedulers.

Sharded extraction
------------------
A store's sequences are cut into shard files of ``shard_size`` sequences in data order
(``shard-00000.nc`` holds sequences ``[0, shard_size)``, ...). ``--shard I/N`` (0-based
``I``) gives process ``I`` the contiguous block of whole shard files
``[I * S // N, (I + 1) * S // N)`` of the ``S`` shards, so the N part stores hold exactly
the single-process store's shard files (same boundaries, global sequence indices, same
config and ``config_hash``: the part is recorded in the manifest's ``part``, outside the
hashed config). ``attngeom store merge`` of all N parts is the single-process store.

Schedulers
----------
:func:`scheduler` runs dask computations of a block on a ``LocalCluster`` (``local:N``) or
an existing cluster (``tcp://HOST:PORT``); results are identical to the local scheduler.
"""

from __future__ import annotations

import logging
import signal
import threading

import re
from contextlib import contextmanager
from typing import Iterator

from ..errors import StoreError

SHARD_HELP = "use --shard I/N with 0 <= I < N, e.g. --shard 0/4 ... --shard 3/4"
SCHEDULER_HELP = ("use local:N (a LocalCluster of N worker processes) or tcp://HOST:PORT "
                  "(an existing dask scheduler)")


def parse_shard(spec: str | tuple[int, int]) -> tuple[int, int]:
    """``"I/N"`` (or ``(I, N)``) -> ``(I, N)``; ValueError with a one-line fix otherwise."""
    if isinstance(spec, tuple):
        index, count = spec
    else:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(spec))
        if not m:
            raise ValueError(f"--shard '{spec}' is not I/N; {SHARD_HELP}")
        index, count = int(m.group(1)), int(m.group(2))
    if not (isinstance(index, int) and isinstance(count, int)) or count < 1 \
            or not 0 <= index < count:
        raise ValueError(f"--shard {index}/{count} is out of range; {SHARD_HELP}")
    return index, count


def shard_block(n_shards: int, index: int, count: int) -> range:
    """Indices of the shard files that part ``index`` of ``count`` extracts (contiguous)."""
    return range(index * n_shards // count, (index + 1) * n_shards // count)


def part_record(shard: tuple[int, int], n_sequences: int, shard_size: int) -> dict:
    """The manifest's ``part`` entry: which shard files and sequences this part holds
    (``shard``: ``(I, N)`` from :func:`parse_shard`)."""
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
        return "the whole data" if p is None else f"--shard {p['index']}/{p['count']}"
    raise StoreError(f"{store} was started with {name(have)}, not {name(part)}; "
                     "use another --out or the original --shard")


def parse_scheduler(spec: str) -> tuple[str, int | str]:
    """``local:N`` -> ``("local", N)``; ``tcp://HOST:PORT`` -> ``("address", spec)``."""
    text = str(spec).strip()
    m = re.fullmatch(r"local(?::(\d+))?", text)
    if m:
        n = int(m.group(1)) if m.group(1) else None
        if n is None:
            import os
            n = os.cpu_count() or 1
        if n < 1:
            raise ValueError(f"--scheduler '{spec}': need at least 1 worker; {SCHEDULER_HELP}")
        return "local", n
    if re.fullmatch(r"(tcp|tls)://[A-Za-z0-9_.\-\[\]:]+:\d{1,5}", text):
        return "address", text
    raise ValueError(f"--scheduler '{spec}' is not understood; {SCHEDULER_HELP}")


@contextmanager
def scheduler(spec: str | None) -> Iterator[object | None]:
    """Run dask computations inside the block on ``spec``'s cluster; close it after.

    Parameters
    ----------
    spec : None (the default local threaded scheduler, yields None), ``local:N`` (start a
        ``LocalCluster(n_workers=N, threads_per_worker=1, processes=True)``) or
        ``tcp://HOST:PORT`` (connect to a running ``dask scheduler``).

    Yields
    ------
    The ``distributed.Client`` (registered as dask's default scheduler), or None.
    """
    if spec is None or str(spec).strip() == "":
        yield None
        return
    kind, value = parse_scheduler(spec)
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ValueError("--scheduler needs dask.distributed; pip install distributed") from None
    cluster = client = None
    try:
        if kind == "local":
            with _signals_deferred():          # a half-started cluster cannot be closed
                cluster = LocalCluster(n_workers=value, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
            client = Client(cluster)
        else:
            client = _connect(Client, value)
        yield client
    except BaseException:
        # stopped (Ctrl-C, SIGTERM) or failed: the cluster's shutdown then logs every task it
        # cancels, a page of warnings over the one line that says what happened
        for name in ("distributed", "asyncio"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        raise
    finally:
        for part in (client, cluster):
            if part is not None:
                part.close()


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive within the block are handled as it ends (main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, object]] = []
    previous = {n: signal.signal(n, lambda *got: caught.append(got))
                for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number, frame in caught[:1]:
            handler = previous[number]
            if callable(handler):
                handler(number, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(number)


def _connect(client_class, address: str):
    """A client of the dask scheduler at ``address``, or a one-line error."""
    try:
        return client_class(address, timeout="10s")
    except (OSError, TimeoutError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"cannot reach the dask scheduler at {address} ({first}); start it "
                         "with `dask scheduler` and workers with `dask worker ADDRESS`") \
            from None
