"""Every option of every stage, declared once: default, type, choices and help text.

A stage's options are a dataclass whose fields carry their command-line form (:func:`option`):
:class:`ExtractConfig` (``attngeom extract``), :class:`FaithConfig` (``attngeom faithfulness``)
and :class:`AnalysisOptions` (``attngeom analyze``; ``report`` when it runs the analyses) are
the Python API's configs too; what only a command takes (model, data, output, progress) is
declared in :mod:`.commands`. From the declarations:

- :func:`add_arguments` makes a command's argparse arguments (flag, type, choices, default
  shown in the help), :func:`from_args` the dataclass from the parsed arguments;
- each stage's ``check()`` is its one validation, called by the command line before torch is
  imported and by the Python API on entry;
- :func:`identity` is what shapes the numbers (recorded in a store's manifest, or the
  provenance of analysis results), :func:`mismatches` compares it with what a store recorded.

Torch-free: the command line, extract, analysis and reports import it alike. Add an option by
adding a field with :func:`option` to its stage; its command picks it up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import metrics as M
from .. import vocab as V
from .spec import (add_arguments, check_fields, documented, flag_of, from_args, identity, mismatches,
                         option, provenance)
from ..errors import Refusal

__all__ = ["ExtractConfig", "FaithConfig", "AnalysisOptions", "REPORT_ANALYSIS", "option",
           "add_arguments", "from_args", "check_fields", "check_sink_window", "identity",
           "mismatches", "provenance", "flag_of"]


def check_sink_window(sink_k: int, max_length: int) -> None:
    """ValueError unless the sink keys (the first ``sink_k`` positions) are fewer than the
    sequence's ``max_length`` tokens: otherwise every key would be a sink."""
    if sink_k >= max_length:
        raise Refusal(f"--sink-k {sink_k} is not shorter than --max-length {max_length}: "
                         f"every key would be a sink; use a --sink-k below {max_length} "
                         f"(e.g. 1) or a larger --max-length")


# ----------------------------------------------------------------------------- common
DTYPE_HELP = "float32, bfloat16 or float16 (GPU)"



# ----------------------------------------------------------------------------- extract
@documented
@dataclass
class ExtractConfig:
    """Options of an extraction run (``attngeom extract``).

    All but ``batch_size``, ``device`` and ``dtype`` are recorded in the store's config
    (``dtype`` with the model).
    """

    mode: str = option(V.COMPACT, "store layout: every (query, key) pair, or sink and tail keys",
                       choices=V.LAYOUTS, record="options")
    sink_k: int = option(V.SINK_K, "sink keys: the first k positions", at_least=1,
                         record="options")
    tail_w: int = option(V.TAIL_W, "tail window: w most recent keys", at_least=1,
                         record="options")
    max_length: int = option(V.MAX_LENGTH, "tokens per text (truncated)", at_least=1,
                             record="options")
    limit: int | None = option(None, "use the first N texts", type=int, at_least=1,
                               record="data")
    text_field: str | None = option(None, "field of JSONL/Parquet records", type=str,
                                    record="data")
    bos: str = option(V.BOS_AUTO, "BOS first: auto (texts: the tokenizer's special tokens; "
                      "probe: specs: none), yes, or no (texts without special tokens)",
                      choices=V.BOS_CHOICES, record="data", omit_default=True)
    min_length: int | None = option(None, "drop texts shorter than this many tokens (special "
                                          "tokens included) instead of padding them; --limit "
                                          "counts the texts kept", type=int, at_least=1,
                                    record="data", omit_default=True)
    shard_size: int | None = option(None, "sequences per shard file (default: about "
                                     f"{V.SHARD_BYTES >> 20} MiB)",
                                    type=int, at_least=1, record="options", auto=True)
    store_text: bool = option(True, "leave token strings out", flag="--no-text", kind="negated",
                              record="options")
    precision: str = option(V.FLOAT32, "float32, or packed (about half the bytes): alpha and "
                            "cosines as CF-packed int16 (errors <= 7.7e-6 / 3.06e-5), norms with "
                            "14 mantissa bits (relative error <= 3.1e-5), middle_count once per "
                            "layer (store/format/packing.py)", choices=V.PRECISIONS,
                            record="options", omit_default=True)
    batch_size: int = option(V.BATCH_SIZE, "texts per forward pass", at_least=1)
    device: str = option("cpu", "cpu, cuda, cuda:N or mps")
    dtype: str = option("float32", DTYPE_HELP)
    # recorded by the run only where they apply (data.image_field, model.tower)
    image_field: str | None = option(None, "image column of an hf: image dataset (default: "
                                     "image)", type=str)
    tower: str | None = option(None, "measure one tower of a multimodal checkpoint (e.g. "
                               "vision: the vision model of a full CLIP or SigLIP checkpoint)",
                               type=str, choices=("vision", "text"))

    def check(self) -> None:
        """ValueError naming the first bad option (one line, with the fix)."""
        check_fields(self)
        check_sink_window(self.sink_k, self.max_length)


# ----------------------------------------------------------------------------- faithfulness
NAME = re.compile(r"[A-Za-z0-9_-]+")


@documented
@dataclass
class FaithConfig:
    """Options of a faithfulness run (``attngeom faithfulness``).

    All but ``batch_size``, ``device``, ``name`` and ``max_hours`` shape the numbers
    (:meth:`options`, recorded with the result).
    """

    task: str = option("lm", "lm (perplexity of texts) or a task scored by accuracy",
                       choices=V.TASKS, record="options")
    metrics: tuple[str, ...] = option(M.DEFAULT, "comma-separated metrics (registered ones: "
                                      "attngeom/common/metrics.py)", kind="names",
                                      choices=M.names, choices_note=M.failed_note,
                                      record="options")
    modes: tuple[str, ...] = option(V.REMOVAL_MODES, "remove the top or the bottom keys",
                                    kind="names", choices=V.REMOVAL_MODES, record="options")
    ranks: tuple[str, ...] = option(V.RANKS, "rank by score (signed) or |score| (magnitude) "
                                    "(--rank: the same, its earlier name)",
                                    aliases=("--rank",), kind="names", choices=V.RANKS,
                                    record="options")
    # p = 0 removes no key and p = 1 every eligible one: both ends are defined conditions
    fractions: tuple[float, ...] = option(V.FRACTIONS, "removal fractions p", kind="numbers",
                                          within=(0, 1, "[]"), record="options")
    granularity: str = option(
        V.GRANULARITY, "rank keys within each head and query (head), all (head, key) pairs of "
                       "a query (query), or head-summed scores per key (token)",
        choices=V.GRANULARITIES, record="options")
    layers: str | tuple[int, ...] | None = option(
        None, "intervene only in these layers, e.g. 0:4,7 (default: all)", kind="ranges",
        record="options")
    max_length: int = option(V.MAX_LENGTH, "tokens per row (truncated)", at_least=1,
                             record="options")
    limit: int | None = option(None, "use the first N texts/items", type=int, at_least=1,
                               record="options")
    text_field: str | None = option(None, "field of JSONL/Parquet records (lm)", type=str,
                                    record="options")
    dev: str | None = option(None, "MMLU exemplars (default: mmlu_dev.jsonl next to "
                                   "mmlu_test.jsonl)", type=str, record="options")
    k_shot: int = option(V.K_SHOT, "MMLU exemplars per prompt", at_least=0, record="options")
    drift: bool = option(True, "skip the semantic-drift pass (sink values zeroed)",
                         flag="--no-drift", kind="negated", record="options")
    sink_k: int = option(V.SINK_K, "sink keys: the first k positions", at_least=1,
                         record="options")
    drift_low_fraction: float = option(
        V.DRIFT_LOW_FRACTION, "lowest-norm share of head outputs whose cone alignment is "
                              "reported", within=(0, 1, "(]"), record="options")
    block_size: int = option(V.BLOCK_SIZE, "texts/items per checkpoint block (resume "
                                           "granularity)", at_least=1, record="options")
    batch_size: int = option(V.BATCH_SIZE, "rows per forward pass", at_least=1)
    device: str = option("cpu", "cpu, cuda, cuda:N or mps")
    dtype: str = option("float32", DTYPE_HELP, record="options")
    name: str = option(V.FAITHFULNESS_NAME, "result file <name>.nc")
    max_hours: float = option(V.MAX_HOURS, "refuse a run whose value-zeroing passes are "
                              "estimated (on this machine, before it starts) to take longer "
                              "(hours; 0: no limit)", within=(0, float("inf"), "[)"))

    def check(self) -> None:
        """ValueError naming the first bad option (one line, with the fix)."""
        check_fields(self)
        check_sink_window(self.sink_k, self.max_length)
        M.check_granularity(self.metrics, self.granularity)
        if not NAME.fullmatch(self.name):
            raise Refusal(f"--name '{self.name}': use letters, digits, '-' and '_' only")

    def options(self) -> dict:
        """The options that determine the numbers (identity of a run)."""
        return identity(self)


# ----------------------------------------------------------------------------- analysis
@documented
@dataclass
class AnalysisOptions:
    """Options of the four analyses (``attngeom analyze``, :func:`attngeom.analysis.run_all`).

    Those with ``provenance`` are copied into every result as ``analysis_<name>``.
    """

    sink_k: int | None = option(None, "sink keys k (default: the store's; a compact store "
                                      "needs its own)", type=int, at_least=1, provenance=True)
    tail_w: int | None = option(None, f"tail window w of the decomposition (default: the "
                                      f"store's, else {V.TAIL_W})", type=int, at_least=1,
                                provenance=True)
    # a sink rate lies in [0, 1]: at 0 every head that looks at the sink at all is a sink head,
    # at 1 or above none can be
    epsilon: float = option(V.EPSILON, "sink-head threshold on the mean sink rate (Gu et al.)",
                            within=(0, 1, "()"), provenance=True)
    n_boot: int = option(V.N_BOOT, "sequence-cluster bootstrap resamples for the vertex CI "
                                   "(0: off; --bootstrap: the same, its earlier name)",
                         aliases=("--bootstrap",), at_least=0, provenance=True)
    seed: int = option(V.SEED, "seed of the bootstrap and subsamples", at_least=0,
                       provenance=True)             # numpy's SeedSequence takes no negatives
    level: float = option(V.LEVEL, "test/FDR level", within=(0, 1, "()"), provenance=True)
    order_resamples: int = option(V.ORDER_RESAMPLES, "bootstrap resamples of each faithfulness "
                                                     "order step's CI", at_least=1)
    layers: str | tuple[int, ...] | None = option(
        None, "layers to analyse, e.g. 0:4,7 (default: all)", kind="ranges")

    def check(self) -> None:
        """ValueError naming the first bad option (one line, with the fix)."""
        check_fields(self)


# analysis options `report` takes
REPORT_ANALYSIS = ("epsilon", "n_boot", "seed", "level", "order_resamples")


