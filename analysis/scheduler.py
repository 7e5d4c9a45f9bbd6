"""Where the analyses' dask computations run: the local threads, a ``LocalCluster`` of worker
processes (``--scheduler local:N``) or an existing cluster (``tcp://HOST:PORT``); results are
identical to the local scheduler.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from contextlib import contextmanager
from typing import Iterator
from attngeom.common.errors import Refusal

SCHEDULER_HELP = ("use local:N (a LocalCluster of N worker processes) or tcp://HOST:PORT "
                  "(an existing dask scheduler)")


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
            raise Refusal(f"--scheduler '{spec}': need at least 1 worker; {SCHEDULER_HELP}")
        return "local", n
    if re.fullmatch(r"(tcp|tls)://[A-Za-z0-9_.\-\[\]:]+:\d{1,5}", text):
        return "address", text
    raise Refusal(f"--scheduler '{spec}' is not understood; {SCHEDULER_HELP}")


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
        raise Refusal("--scheduler needs dask.distributed; pip install distributed") from None
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
        raise Refusal(f"cannot reach the dask scheduler at {address} ({first}); start it "
                         "with `dask scheduler` and workers with `dask worker ADDRESS`") \
            from None
