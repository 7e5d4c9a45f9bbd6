"""The words attngeom uses, each defined once: layouts, key groups, faithfulness conditions, tasks
and the default of every option.

Torch-free, so that extract (which imports torch), store, analysis, reports and the command
line all import the same names. Variable and dimension names of a store are in
:mod:`attngeom.store.format.schema`; the formulas of derived quantities in
:mod:`attngeom.store.format.derive`.
"""

from __future__ import annotations

from . import tasks as _tasks

# ------------------------------------------------------------------ store layouts
DENSE, COMPACT = "dense", "compact"
LAYOUTS = (DENSE, COMPACT)               # --mode of extract: every (query, key) pair, or sink+tail

# ------------------------------------------------------------------ stored precision
FLOAT32, PACKED = "float32", "packed"
PRECISIONS = (FLOAT32, PACKED)           # --precision of extract: all float32, or alpha and the
#                                          cosines as CF-packed int16 (store/format/packing.py)

# ------------------------------------------------------------------ key groups of a query i
SINK, TAIL, MIDDLE = "sink", "tail", "middle"
GROUPS = (SINK, TAIL, MIDDLE)            # j < k; the w most recent non-sink keys j <= i; the rest

# ------------------------------------------------------------------ faithfulness
# the metrics themselves (names, labels, kernels): attngeom/common/metrics.py
COMPREHENSIVENESS, SUFFICIENCY = "comprehensiveness", "sufficiency"
REMOVAL_MODES = (COMPREHENSIVENESS, SUFFICIENCY)   # remove the top / the bottom fraction p
SIGNED, MAGNITUDE = "signed", "magnitude"
RANKS = (SIGNED, MAGNITUDE)                        # rank by score, or by |score|
GRANULARITIES = ("head", "query", "token")         # keys ranked per (head, query), per query, per key
TASKS = _tasks.names()                             # the task table: attngeom/common/tasks.py

BOS_AUTO = "auto"
BOS_CHOICES = (BOS_AUTO, "yes", "no")    # --bos of extract (Gu et al.'s probes: no BOS)

# ------------------------------------------------------------------ defaults
SINK_K = 1                # sink keys: the first k positions
TAIL_W = 8                # tail window: the w most recent non-sink keys up to the query
MAX_LENGTH = 512          # tokens per text
BATCH_SIZE = 4
EPSILON = 0.3             # sink-head threshold on the mean sink rate (Gu et al., ICLR 2025)
N_BOOT = 200              # sequence-cluster bootstrap resamples of the convexity vertex CI
ORDER_RESAMPLES = 9999    # bootstrap resamples of each faithfulness order step's CI
#                           (scipy.stats.bootstrap's default)
LEVEL = 0.05              # test and false-discovery level
SEED = 0
FRACTIONS = (0.1, 0.2, 0.5)           # removal fractions p of `attngeom faithfulness`
# removal fractions p of `attngeom run`, the five-minute demo: a set of its own, documented as
# the demo's (README's quick start, `attngeom run`'s docstring); `attngeom faithfulness`
# defaults to FRACTIONS
RUN_FRACTIONS = (0.1, 0.25, 0.5)
GRANULARITY = "head"
DRIFT_LOW_FRACTION = 0.1  # lowest-norm share of head outputs followed by the drift probe
SHARD_BYTES = 256 << 20   # a shard file holds about this much before compression (--shard-size)
MAX_SHARD_SEQUENCES = 256  # ... and at most this many sequences
BLOCK_SIZE = 16           # faithfulness texts/items per checkpoint block
MAX_HOURS = 24.0          # value zeroing's estimated time beyond which a run is refused
K_SHOT = 5                # MMLU exemplars per prompt
FAITHFULNESS_NAME = "faithfulness"    # result file <name>.nc
VIEW_MAX_BYTES = 25_000_000           # size limit of the page `attngeom view` writes
EXPORT_FORMATS = ("zarr", "parquet", "hf")          # `attngeom store export --format`
# `attngeom bench WHAT`: the scripts of benchmarks/ (attngeom/commands/bench.py)
BENCHMARKS = ("extract", "command", "store", "analysis", "faithfulness", "value_zeroing",
              "length", "peers", "gpu")
