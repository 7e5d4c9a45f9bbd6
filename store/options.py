"""Every option of every stage, declared once: default, type, choices and help text.

A stage's options are a dataclass whose fields carry their command-line form (:func:`option`):
:class:`ExtractConfig` (``attngeom extract``), :class:`FaithConfig` (``attngeom faithfulness``)
and :class:`AnalysisOptions` (``attngeom analyze``; ``report`` when it runs the analyses) are
the Python API's configs too; :class:`ExtractCommand`, :class:`FaithCommand`,
:class:`AnalyzeCommand`, :class:`ReportCommand` and :class:`RunOptions` hold what only the
command line takes (model, data, output, progress). From the declarations:

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

import argparse
import dataclasses
import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

from . import vocab as V
from .ranges import SYNTAX, check_syntax

LISTS = ("names", "numbers")        # comma-separated on the command line, tuples in Python
KINDS = (None, "flag", "negated", "ranges") + LISTS


# ----------------------------------------------------------------------------- declaring
def option(default: Any, help: str, *, flag: str | None = None, aliases: Sequence[str] = (),
           kind: str | None = None, type: Callable | None = None,
           choices: Sequence | None = None, at_least: int | None = None,
           within: tuple[float, float, str] | None = None, record: str | None = None,
           provenance: bool = False, positional: bool = False, required: bool = False,
           metavar: str | None = None, cli: bool = True) -> Any:
    """A dataclass field declaring one option.

    Parameters
    ----------
    default, help : the default value and the help text (the default is appended to it).
    flag, aliases : the command-line flag (default ``--field-name``) and other spellings.
    kind : None (one value of ``type``), ``"flag"`` (``--x`` sets True), ``"negated"``
        (``--no-x`` sets False), ``"names"``/``"numbers"`` (comma-separated, a tuple),
        ``"ranges"`` (the range syntax of :mod:`attngeom.store.ranges`).
    type : the command line's converter (default: the type of ``default``).
    choices : allowed values (of each item for ``names``).
    at_least : the smallest allowed integer; within : ``(lo, hi, "[]")``, brackets ``(``/``[``
        for open/closed ends.
    record : where a store's manifest records the option (``"options"`` or ``"data"`` of its
        config): it shapes the numbers and is part of the store's identity.
    provenance : copied into analysis results as ``analysis_<name>``.
    positional, required, metavar, cli : argparse details; ``cli=False``: Python API only.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown option kind {kind!r}")
    meta = dict(help=help, flag=flag, aliases=tuple(aliases), kind=kind, type=type,
                choices=None if choices is None else tuple(choices), at_least=at_least,
                within=within, record=record, provenance=provenance, positional=positional,
                required=required, metavar=metavar, cli=cli)
    return field(default=default, metadata=meta)


def flag_of(f: dataclasses.Field) -> str:
    """``--max-length`` for the field ``max_length`` (or its declared flag)."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


# ----------------------------------------------------------------------------- argparse
def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _numbers(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in _names(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}': give comma-separated numbers such as 0.1,0.2,0.5") from None


def _ranges(what: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        try:
            return check_syntax(text, what)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def add_arguments(parser: argparse.ArgumentParser, cls: type, only: Sequence[str] | None = None,
                  defaults: dict | None = None) -> None:
    """Add the options of the dataclass ``cls`` to ``parser``.

    ``only``: these fields, in this order (default: every field with ``cli``); ``defaults``:
    other defaults for this command (``attngeom run`` uses smaller ones).
    """
    by_name = {f.name: f for f in fields(cls)}
    names = list(only) if only is not None else [f.name for f in fields(cls) if f.metadata["cli"]]
    for name in names:
        f = by_name[name]
        default = (defaults or {}).get(name, f.default)
        parser.add_argument(*_spellings(f), **_argparse_kwargs(f, default))


def _spellings(f: dataclasses.Field) -> tuple[str, ...]:
    return (f.name,) if f.metadata["positional"] else (flag_of(f), *f.metadata["aliases"])


def _argparse_kwargs(f: dataclasses.Field, default: Any) -> dict:
    m = f.metadata
    kind, help_text = m["kind"], m["help"]
    if m["kind"] == "names" and m["choices"]:
        help_text += f"; from {', '.join(m['choices'])}"
    if default is not None and kind not in ("flag", "negated") and not m["required"]:
        help_text += f" (default {_show(default)})"
    kw: dict = dict(help=help_text)
    if not m["positional"]:
        kw["dest"] = f.name
    if kind == "flag":
        return dict(kw, action="store_true")
    if kind == "negated":
        return dict(kw, action="store_false")
    kw["default"] = default
    if m["required"] and not m["positional"]:
        kw["required"] = True
    if m["metavar"] or (m["flag"] and not m["positional"]):
        kw["metavar"] = m["metavar"] or m["flag"].lstrip("-").replace("-", "_").upper()
    if kind == "names":
        kw["type"] = _names
    elif kind == "numbers":
        kw["type"] = _numbers
    elif kind == "ranges":
        kw["type"] = _ranges(flag_of(f))
    else:
        kw["type"] = m["type"] or (type(default) if default is not None else str)
        if m["choices"]:
            kw["choices"] = list(m["choices"])
    return kw


def from_args(args: argparse.Namespace, cls: type, **overrides) -> Any:
    """The ``cls`` object of parsed ``args``: fields the command has, the rest their default;
    ``overrides`` win over both."""
    values = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
    return cls(**{**values, **overrides})


# ----------------------------------------------------------------------------- checking
def check_fields(obj: Any) -> None:
    """ValueError naming the first option of ``obj`` outside its declared choices or bounds."""
    for f in fields(obj):
        value, m = getattr(obj, f.name), f.metadata
        if value is None:
            continue
        what = flag_of(f)
        if m["kind"] in LISTS:
            _check_list(what, value, m)
        elif m["kind"] == "ranges":
            _check_ranges(what, value)
        elif m["choices"] and value not in m["choices"]:
            raise ValueError(f"{what} must be one of {', '.join(map(str, m['choices']))}, "
                             f"not '{value}'")
        if m["at_least"] is not None and not (isinstance(value, int) and value >= m["at_least"]):
            raise ValueError(f"{what} must be at least {m['at_least']}, not {value}")
        if m["within"] is not None and m["kind"] != "numbers" and not _inside(value, m["within"]):
            raise ValueError(f"{what} {value} must be in {_interval(m['within'])}")


def _check_list(what: str, values: Sequence, m: dict) -> None:
    values = tuple(values)
    if m["kind"] == "names":
        bad = [v for v in values if m["choices"] and v not in m["choices"]]
        if bad or not values or len(set(values)) != len(values):
            raise ValueError(f"{what} {','.join(map(str, values))}: give distinct values from "
                             f"{', '.join(m['choices'] or ())}")
        return
    if not values or len(set(values)) != len(values) or any(
            not isinstance(v, (int, float)) or not _inside(v, m["within"]) for v in values):
        raise ValueError(f"{what} '{_show(values)}': give distinct numbers in "
                         f"{_interval(m['within'])}, e.g. 0.1,0.2,0.5")


def _check_ranges(what: str, value: Any) -> None:
    if isinstance(value, str):
        check_syntax(value, what)
    elif not all(isinstance(v, int) and v >= 0 for v in value) or not value:
        raise ValueError(f"{what} {value}: give non-negative integers or {SYNTAX}")


def _inside(value: float, within: tuple[float, float, str] | None) -> bool:
    if within is None:
        return True
    lo, hi, ends = within
    return (lo <= value if ends[0] == "[" else lo < value) and \
        (value <= hi if ends[1] == "]" else value < hi)


def _interval(within: tuple[float, float, str] | None) -> str:
    lo, hi, ends = within or (float("-inf"), float("inf"), "()")
    return f"{ends[0]}{lo:g}, {hi:g}{ends[1]}"


def check_sink_window(sink_k: int, max_length: int) -> None:
    """ValueError unless the sink keys (the first ``sink_k`` positions) are fewer than the
    sequence's ``max_length`` tokens: otherwise every key would be a sink."""
    if sink_k >= max_length:
        raise ValueError(f"--sink-k {sink_k} is not shorter than --max-length {max_length}: "
                         f"every key would be a sink; use a --sink-k below {max_length} "
                         f"(e.g. 1) or a larger --max-length")


# ----------------------------------------------------------------------------- identity
AUTOMATIC = ("shard_size",)         # None: chosen by the run, recorded as chosen


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def identity(obj: Any, where: str | None = None) -> dict:
    """The options of ``obj`` that shape the numbers (declared with ``record``), as JSON
    values; ``where``: only those recorded there (``"options"`` or ``"data"``)."""
    return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)
            if f.metadata["record"] and where in (None, f.metadata["record"])}


def mismatches(obj: Any, config: dict) -> list[str]:
    """Options of ``obj`` whose value differs from the ``config`` a store recorded, as
    ``"name: recorded -> requested"`` (empty: the same). An option left None that the run
    chose itself (``shard_size``) matches any recorded value."""
    out = []
    for f in fields(obj):
        where = f.metadata["record"]
        if not where:
            continue
        want = _plain(getattr(obj, f.name))
        have = (config.get(where) or {}).get(f.name, "(absent)")
        if want is None and f.name in AUTOMATIC:
            continue
        if have != want:
            out.append(f"{f.name}: {have!r} -> {want!r}")
    return out


def provenance(obj: Any, **resolved) -> dict:
    """The options declared with ``provenance``, ``resolved`` values replacing the requested
    ones (e.g. the store's sink_k for None)."""
    return {f.name: resolved.get(f.name, getattr(obj, f.name)) for f in fields(obj)
            if f.metadata["provenance"]}


# ----------------------------------------------------------------------------- common
MODEL_HELP = "hub id, model directory, .gguf file, or smollm2-135m/gemma3-270m/minilm-l6"
DATA_HELP = "a .jsonl/.parquet/.txt file, hf:NAME[:CONFIG]:SPLIT, or builtin"
TRUST_HELP = "allow model code from the hub (off by default)"
DTYPE_HELP = "float32, bfloat16 or float16 (GPU)"


# ----------------------------------------------------------------------------- extract
@dataclass
class ExtractConfig:
    """Options of an extraction run; all but ``batch_size``/``device``/``dtype`` are recorded in
    the store's config (``dtype`` with the model)."""

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
    shard_size: int | None = option(None, "sequences per shard file (default: about 256 MiB)",
                                    type=int, at_least=1, record="options")
    store_text: bool = option(True, "leave token strings out", flag="--no-text", kind="negated",
                              record="options")
    batch_size: int = option(V.BATCH_SIZE, "texts per forward pass", at_least=1)
    device: str = option("cpu", "cpu, cuda, cuda:N or mps")
    dtype: str = option("float32", DTYPE_HELP)

    def check(self) -> None:
        """ValueError naming the first bad option (one line, with the fix)."""
        check_fields(self)
        check_sink_window(self.sink_k, self.max_length)


@dataclass
class ExtractCommand:
    """What ``attngeom extract`` takes besides :class:`ExtractConfig`."""

    model: str = option(None, MODEL_HELP, type=str, required=True)
    data: str = option(None, DATA_HELP, type=str, required=True)
    out: str = option(None, "store directory (created, or resumed)", type=str, required=True)
    shard: str | None = option(
        None, "extract only part I (0-based) of N, a contiguous block of shard files; join the "
              "N part stores with `attngeom store merge`", type=str, metavar="I/N")
    trust_remote_code: bool = option(False, TRUST_HELP, kind="flag")
    quiet: bool = option(False, "no progress bar", kind="flag")


# ----------------------------------------------------------------------------- faithfulness
NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclass
class FaithConfig:
    """Options of a faithfulness run; all but ``batch_size``/``device``/``name`` shape the
    numbers (:meth:`options`, recorded with the result)."""

    task: str = option("lm", "lm (perplexity of texts) or a task scored by accuracy",
                       choices=V.TASKS, record="options")
    metrics: tuple[str, ...] = option(V.METRICS, "comma-separated metrics", kind="names",
                                      choices=V.METRICS, record="options")
    modes: tuple[str, ...] = option(V.REMOVAL_MODES, "remove the top or the bottom keys",
                                    kind="names", choices=V.REMOVAL_MODES, record="options")
    ranks: tuple[str, ...] = option(V.RANKS, "rank by score (signed) or |score| (magnitude)",
                                    aliases=("--rank",), kind="names", choices=V.RANKS,
                                    record="options")
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

    def check(self) -> None:
        """ValueError naming the first bad option (one line, with the fix)."""
        check_fields(self)
        check_sink_window(self.sink_k, self.max_length)
        if not NAME.fullmatch(self.name):
            raise ValueError(f"--name '{self.name}': use letters, digits, '-' and '_' only")

    def options(self) -> dict:
        """The options that determine the numbers (identity of a run)."""
        return identity(self)


@dataclass
class FaithCommand:
    """What ``attngeom faithfulness`` takes besides :class:`FaithConfig`."""

    model: str = option(None, MODEL_HELP, type=str, required=True)
    data: str = option(None, "texts (lm) or task records (.jsonl, hf:...)", type=str,
                       required=True)
    out: str = option(None, "store directory: <name>.nc is written there (created if absent)",
                      type=str, required=True)
    force: bool = option(False, "start over: replace an existing result or interrupted run",
                         kind="flag")
    trust_remote_code: bool = option(False, TRUST_HELP, kind="flag")
    quiet: bool = option(False, "no progress bar", kind="flag")


# ----------------------------------------------------------------------------- analysis
@dataclass
class AnalysisOptions:
    """Options of the four analyses (:func:`attngeom.analysis.run_all`); those with
    ``provenance`` are copied into every result as ``analysis_<name>``."""

    sink_k: int | None = option(None, "sink keys k (default: the store's; a compact store "
                                      "needs its own)", type=int, at_least=1, provenance=True)
    tail_w: int | None = option(None, f"tail window w of the decomposition (default: the "
                                      f"store's, else {V.TAIL_W})", type=int, at_least=1,
                                provenance=True)
    epsilon: float = option(V.EPSILON, "sink-head threshold on the mean sink rate (Gu et al.)",
                            provenance=True)
    n_boot: int = option(V.N_BOOT, "sequence-cluster bootstrap resamples for the vertex CI "
                                   "(0: off)", flag="--bootstrap", at_least=0, provenance=True)
    seed: int = option(V.SEED, "seed of the bootstrap and subsamples", provenance=True)
    level: float = option(V.LEVEL, "test/FDR level", within=(0, 1, "()"), provenance=True)
    layers: str | tuple[int, ...] | None = option(
        None, "layers to analyse, e.g. 0:4,7 (default: all)", kind="ranges")

    def check(self) -> None:
        """ValueError naming the first bad option (one line, with the fix)."""
        check_fields(self)


@dataclass
class AnalyzeCommand:
    """What ``attngeom analyze`` takes besides :class:`AnalysisOptions`."""

    store: str = option(None, "store directory or file written by `attngeom extract`", type=str,
                        positional=True)
    out: str = option(None, "output directory for the .nc files and CSV", type=str,
                      required=True)
    no_progress: bool = option(False, "hide the progress bar", kind="flag")
    scheduler: str | None = option(
        None, "dask.distributed cluster: local:N (N worker processes) or tcp://HOST:PORT (a "
              "running `dask scheduler`); default: in-process", type=str)


@dataclass
class ReportCommand:
    """What ``attngeom report`` takes; the analysis options apply when the analyses run."""

    store: str = option(None, "store directory written by `attngeom extract`", type=str,
                        positional=True)
    out: str | None = option(None, "the PDF to write (default STORE/report.pdf)", type=str)
    analysis: str | None = option(None, "analysis results folder (default STORE/analysis; run "
                                        "when missing)", type=str)
    faithfulness: str = option(V.FAITHFULNESS_NAME, "which recorded faithfulness result to "
                                                    "show", metavar="NAME")
    no_progress: bool = option(False, "hide the progress bar", kind="flag")


REPORT_ANALYSIS = ("epsilon", "n_boot", "seed", "level")   # analysis options `report` takes


# ----------------------------------------------------------------------------- run
@dataclass
class RunOptions:
    """What ``attngeom run`` takes besides its stages' options (:data:`RUN_STAGES`)."""

    out: str = option("runs/demo", "output folder")
    model: str = option("smollm2-135m", "hub id, model directory, .gguf file or built-in name")
    data: str = option("builtin", "texts: .jsonl/.parquet/.txt, hf:..., builtin")
    faith_limit: int = option(8, "texts for the faithfulness experiment (0 skips it)",
                              at_least=0)
    threads: int | None = option(
        None, "CPU threads of torch and BLAS (default: $OMP_NUM_THREADS, else 1; on a shared "
              "machine more threads wait on each other and run slower)", type=int, at_least=1)
    trust_remote_code: bool = option(False, TRUST_HELP, kind="flag")
    quiet: bool = option(False, "no progress bars", kind="flag")

    def check(self, extract: ExtractConfig) -> None:
        """ValueError naming the first bad option; ``extract``: the run's extraction config."""
        check_fields(self)
        if extract.limit is not None and self.faith_limit > extract.limit:
            raise ValueError(f"--faith-limit must be between 0 and --limit ({extract.limit})")


# stage, the options `run` exposes, and its smaller defaults (the five-minute demo)
RUN_STAGES: tuple[tuple[type, tuple[str, ...], dict], ...] = (
    (ExtractConfig, ("limit", "max_length", "mode", "text_field", "batch_size", "device",
                     "dtype"), {"limit": 48, "max_length": 128}),
    (FaithConfig, ("metrics", "ranks", "fractions"),
     {"metrics": V.PAPER_ORDER, "fractions": (0.1, 0.25, 0.5)}),
    (AnalysisOptions, ("n_boot", "seed"), {}),
)
RUN_FAITH_BLOCK = 4                 # texts per faithfulness checkpoint in `run`
