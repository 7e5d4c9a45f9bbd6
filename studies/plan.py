"""The planned cost of the second study: forward passes per step, timed on this machine.

Passes are counted from the faithfulness code's own plan (:func:`ranking_plan` and
:func:`conditions` of extract/faithfulness/experiment.py: distinct rankings x modes x fractions,
plus one clean pass per batch, no drift pass), so a change there changes the plan. A pass is one
forward of one batch. Seconds per pass are timed here, in this process, on one batch of the study's
own texts (:func:`time_faithfulness`: ``compute_block`` with one removal per distinct ranking and
the clean pass; :func:`time_measure`: one ``measure`` call), with ``threads`` torch threads:
CPU-hours = wall hours x threads.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import pandas as pd

COLUMNS = ("step", "runs", "n_units", "batch_size", "batches", "passes_per_batch",
           "batch_passes", "seconds_per_pass", "cpu_seconds_per_pass", "wall_hours",
           "cpu_hours", "threads", "note")


@dataclass
class Timed:
    """Wall-clock and process CPU seconds of one pass (CPU time is what other processes on a
    shared machine do not inflate)."""

    wall: float
    cpu: float


class Clock:
    """Context manager measuring wall and CPU seconds of its block."""

    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c

    def per(self, n: int) -> Timed:
        return Timed(self.wall / n, self.cpu / n)


def n_batches(n_units: int, batch_size: int) -> int:
    """Batches of a faithfulness run over ``n_units`` texts (the last one may be short)."""
    return math.ceil(n_units / batch_size) if n_units else 0


@dataclass
class Step:
    """One planned step: ``runs`` runs of ``passes_per_batch`` passes over ``n_units`` units."""

    step: str
    n_units: int
    batch_size: int
    passes_per_batch: int
    timed: Timed
    threads: int
    runs: int = 1
    note: str = ""

    def row(self) -> dict:
        batches = n_batches(self.n_units, self.batch_size)
        passes = self.runs * batches * self.passes_per_batch
        return dict(step=self.step, runs=self.runs, n_units=self.n_units,
                    batch_size=self.batch_size, batches=batches,
                    passes_per_batch=self.passes_per_batch, batch_passes=passes,
                    seconds_per_pass=round(self.timed.wall, 3),
                    cpu_seconds_per_pass=round(self.timed.cpu, 3),
                    wall_hours=round(passes * self.timed.wall / 3600, 3),
                    cpu_hours=round(passes * self.timed.cpu / 3600, 3),
                    threads=self.threads, note=self.note)


def table(steps: list[Step]) -> pd.DataFrame:
    """The plan, one row per step, and a total row."""
    frame = pd.DataFrame([s.row() for s in steps], columns=list(COLUMNS))
    total = dict(step="total", batch_passes=int(frame["batch_passes"].sum()),
                 wall_hours=round(frame["wall_hours"].sum(), 3),
                 cpu_hours=round(frame["cpu_hours"].sum(), 3), note="")
    out = pd.concat([frame, pd.DataFrame([total])], ignore_index=True)
    for col in ("runs", "n_units", "batch_size", "batches", "passes_per_batch", "threads"):
        out[col] = out[col].astype("Int64")
    return out


def faith_config(**options):
    """A FaithConfig of the study's options (extract/faithfulness/experiment.py; import
    deferred)."""
    from attngeom.extract.faithfulness.experiment import FaithConfig

    cfg = FaithConfig(**options)
    cfg.check()
    return cfg


def passes_per_batch(cfg) -> int:
    """Forward passes per batch of a faithfulness run: removals + clean (+ drift)."""
    from attngeom.extract.faithfulness.experiment import conditions, ranking_plan

    plan = ranking_plan(cfg.metrics, cfg.ranks, cfg.granularity)
    return len(conditions(cfg, plan)) + 1 + int(cfg.drift)


def distinct_rankings(cfg) -> list[tuple[str, str]]:
    """The (metric, rank) pairs a run actually computes."""
    from attngeom.extract.faithfulness.experiment import ranking_plan

    return sorted(set(ranking_plan(cfg.metrics, cfg.ranks, cfg.granularity).values()))


def time_faithfulness(loaded, data: str, cfg, repeat: int = 1) -> Timed:
    """Seconds per pass: ``compute_block`` on the first batch of ``data`` with the clean pass
    and one removal per distinct ranking (first mode, largest fraction, the run's layers)."""
    from attngeom.extract.loading.data import pad_token_id
    from attngeom.extract.faithfulness.experiment import compute_block, load_task
    from attngeom.extract.faithfulness.interventions import Removal

    cfg = replace(cfg, limit=cfg.batch_size, drift=False)
    prepared, _ = load_task(cfg, data, loaded.tokenizer)
    layers = None if cfg.layers is None else frozenset(cfg.layers)
    removals = [Removal(m, cfg.modes[0], max(cfg.fractions), r, cfg.granularity, layers)
                for m, r in distinct_rankings(cfg)]
    pad = pad_token_id(loaded.tokenizer)
    compute_block(loaded.model, prepared, cfg, removals[:1], pad)          # warm-up
    with Clock() as clock:
        for _ in range(repeat):
            compute_block(loaded.model, prepared, cfg, removals, pad)
    return clock.per(repeat * (len(removals) + 1))


def time_plain(loaded, data: str, cfg, repeat: int = 1) -> Timed:
    """Seconds of a plain forward (the model's own attention, no handler) of the same batch."""
    import torch

    from attngeom.extract.faithfulness.experiment import load_task

    prepared, _ = load_task(replace(cfg, limit=cfg.batch_size), data, loaded.tokenizer)
    rows = prepared.rows[: cfg.batch_size]
    T = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (T - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    with torch.inference_mode():
        loaded.model(input_ids=ids, attention_mask=mask, use_cache=False)  # warm-up
        with Clock() as clock:
            for _ in range(repeat):
                loaded.model(input_ids=ids, attention_mask=mask, use_cache=False)
    return clock.per(repeat)


def time_measure(model, ids, repeat: int = 1) -> Timed:
    """Seconds of one ``measure`` call (compact layout, the extract defaults) on ``ids``."""
    import torch

    from attngeom.extract.measurement.capture import capture

    x = torch.as_tensor(ids)
    batch = {"input_ids": x, "attention_mask": torch.ones_like(x)}
    capture(model, batch)                                                  # warm-up
    with Clock() as clock:
        for _ in range(repeat):
            capture(model, batch)
    return clock.per(repeat)
