"""The faithfulness metrics: each one entry, the only place a metric is described.

An entry (:class:`Metric`) holds the metric's name, its labels, whether its scores are
non-negative (then ranking by ``|score|`` is ranking by score), which metric it provably ranks keys
like at a granularity (then its results are copied, not recomputed) and the unit of its float32
rounding error. Its two score kernels live in extract/faithfulness/ (torch stays out of the
store): a built-in metric's are found by its name in the table of
:mod:`attngeom.extract.faithfulness.kernels`; a plugin names its own as ``"module:function"``:

- ``fast``: float32 scores of a whole layer and their error bound,
  ``kernel(layer: FastLayer, unit: float) -> (scores, ErrorBound)``
  (:mod:`attngeom.extract.faithfulness.removal_scores`);
- ``exact``: the float64 definition, ``kernel(rows: Rows64) -> scores`` for a ``head``-scope
  metric (a head's score needs that head's output only), ``kernel(alpha, dot, norm_sq)`` for the
  ``layer``-scope one (:mod:`attngeom.extract.faithfulness.exact_scores`), ``kernel(rows:
  TokenRows64) -> scores`` for a ``token``-scope one (a score per key with the heads
  combined, which ranks at token granularity only:
  :mod:`attngeom.extract.faithfulness.field_scores`).

A metric that needs more than the layer's attention says so (``needs``): ``position`` (where
each score is: the random floor), ``residual`` (the layer's residual input and the
normalisations around it: ALTI, the norm-based method), ``below`` (the layers below in the same
pass: rollout), ``sublayer`` (the rest of the layer after its attention, run by the model's own
modules on chosen rows: value zeroing); the kernels read them from ``FastLayer.context`` /
``rows.context`` (:class:`attngeom.extract.faithfulness.context.LayerContext`).

The removal ranking, the recomputed float64 rows, the copy notes, ``faithfulness --metrics``,
the reports' labels and the view's all read this registry; no other code compares a metric's
name. A metric of one's own is one :func:`register` call (docs/howto/metric-plugin.md):

    register(Metric("value_norm_only", symbol="‖ṽ‖", words="value norm", short="norm",
                    abbrev="vn", paper="value norm alone", nonnegative=True,
                    fast="mypkg.scores:fast_value_norm", exact="mypkg.scores:exact_value_norm"))

or, for the command line, an entry point in the ``attngeom.metrics`` group naming a function
that registers it (loaded by :func:`load_plugins`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from .errors import Refusal

# scope: a score needs its head's output / every head's output / is one per (query, key),
# heads combined (ranks at token granularity only)
HEAD, LAYER, TOKEN = "head", "layer", "token"
# what a kernel needs besides the layer's attention (FastLayer.context, extract/faithfulness/):
RESIDUAL = "residual"     # the layer's residual input x and the normalisations around it
BELOW = "below"           # every layer's attention below it, in the same pass (rollout)
POSITION = "position"     # where each score is: layer, sequence, head, query, key (random)
SUBLAYER = "sublayer"     # the layer after its attention, rerun on rows (value zeroing)
NEEDS = (RESIDUAL, BELOW, POSITION, SUBLAYER)
GRANULARITIES = ("head", "query", "token")


@dataclass(frozen=True)
class Metric:
    """One faithfulness metric (see the module docstring).

    Parameters
    ----------
    name : str
        The metric's name, as ``--metrics`` takes it.
    symbol : str
        Its symbol, in figures' legends and the view (``"α‖ṽ‖"``).
    words : str
        Its name in tables and sentences (``"value-weighted"``).
    short : str
        Its name in narrow figure panels.
    abbrev : str
        Its abbreviation in column names of compact tables (``"vw"``).
    paper : str
        The paper's (or its source's) name for it.
    nonnegative : bool
        Every score is >= 0, so ranking by absolute value is ranking by score.
    ranks_like : tuple of (str, str, str)
        ``(granularity, metric, why)``: a metric whose ranking this one provably equals at
        that granularity (its results are then copied, not recomputed).
    error_unit : float
        The float32 rounding error, in units of the kernel's error model.
    within_unit : float
        For a kernel whose error model is ``u Lambda |score|``: its error within one (head, query)
        row, a factor common to the row set aside, in units of u Lambda_w (the model without
        the softmax normaliser's term); 0: not measured, the whole bound serves.
    scope : str
        ``"head"``, ``"layer"`` or ``"token"``: what a score needs (its head's output, every
        head's output) or is (one per query and key, heads combined).
    needs : tuple of str
        What the kernels read besides the layer's attention, among :data:`NEEDS`.
    fast : str
        A plugin's float32 kernel, ``"module:function"``.
    exact : str
        A plugin's float64 kernel, ``"module:function"``.
    color : str
        Its color in figures.
    builtin : bool
        Its kernels are found by name in :mod:`attngeom.extract.faithfulness.kernels`.
    """

    name: str
    symbol: str                     # "α‖ṽ‖": figures' legends, the view
    words: str                      # "value-weighted": tables and sentences
    short: str                      # "value-weighted": narrow figure panels
    abbrev: str                     # "vw": column names of compact tables
    paper: str                      # the paper's (or its source's) name for it
    nonnegative: bool = False       # every score >= 0: |score| ranks as score
    ranks_like: tuple[tuple[str, str, str], ...] = ()   # (granularity, metric, why)
    error_unit: float = 32.0        # float32 rounding error, in units of the kernel's model
    within_unit: float = 0.0        # the same within one head's row, in units of u Lambda_w
    scope: str = HEAD
    needs: tuple[str, ...] = ()     # among NEEDS
    fast: str = ""                  # a plugin's "module:function" of the float32 kernel
    exact: str = ""                 # a plugin's "module:function" of the float64 kernel
    color: str = "#333333"          # figures
    builtin: bool = False           # kernels found by name (extract/faithfulness/kernels.py)

    @property
    def granularities(self) -> tuple[str, ...]:
        """The granularities it ranks at: ``token`` only for a score per key, heads combined."""
        return ("token",) if self.scope == TOKEN else GRANULARITIES

    @property
    def label(self) -> str:
        """The legend label: words and symbol ("value-weighted α‖ṽ‖")."""
        return f"{self.words} {self.symbol}"

    def ranked_by(self, granularity: str) -> str:
        """The metric whose scores a removal at ``granularity`` ranks keys by: one whose
        ranking this one provably equals (``ranks_like``: the same removed keys, fewer float32
        rows left near the cut), else this one."""
        return next((other for gran, other, _ in self.ranks_like if gran == granularity),
                    self.name)

    def same_ranking(self, granularity: str, among) -> tuple[str, str] | None:
        """(metric, why) whose ranking this one provably equals at ``granularity``, when that
        metric is among those run; else None."""
        for gran, other, why in self.ranks_like:
            if gran == granularity and other in among:
                return other, why
        return None


_REGISTRY: dict[str, Metric] = {}


def register(metric: Metric, replace: bool = False) -> Metric:
    """Add ``metric`` to the registry.

    Parameters
    ----------
    metric : Metric
        The entry; one not built in names both its kernels (``fast`` and ``exact``).
    replace : bool
        Overwrite an entry of the same name (refused otherwise).

    Returns
    -------
    Metric
        ``metric``, as registered.

    Raises
    ------
    attngeom.common.errors.Refusal
        For a metric without kernels, an unknown ``scope`` or ``needs``, or a name
        registered already (without ``replace``).
    """
    if not metric.builtin and (not metric.fast or not metric.exact):
        raise Refusal(f"metric '{metric.name}' names no kernels: give fast= and exact= as "
                         "'module:function'")
    if metric.scope not in (HEAD, LAYER, TOKEN):
        raise Refusal(f"metric '{metric.name}': scope must be '{HEAD}', '{LAYER}' or '{TOKEN}'")
    if set(metric.needs) - set(NEEDS):
        raise Refusal(f"metric '{metric.name}': needs must be among "
                      f"{', '.join(repr(n) for n in NEEDS)}")
    if metric.name in _REGISTRY and not replace:
        raise Refusal(f"a metric named '{metric.name}' is registered already; pass "
                         "replace=True to overwrite it")
    _REGISTRY[metric.name] = metric
    return metric


def unregister(name: str) -> None:
    """Remove a metric (a user's; the built-in ones can be removed too, at one's own risk)."""
    _REGISTRY.pop(name, None)


def get(name: str) -> Metric:
    """The entry of ``name``; a one-line ValueError naming the registered ones otherwise."""
    load_plugins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise Refusal(f"unknown metric '{name}'; use one of {', '.join(names())}"
                      f"{failed_note()}") from None


def label(name: str, kind: str = "label") -> str:
    """The metric's ``kind`` of label (``label``, ``words``, ``short``, ``symbol``, ``abbrev``);
    the name itself for a metric not registered here (a file from elsewhere)."""
    load_plugins()
    found = _REGISTRY.get(name)
    return name if found is None else getattr(found, kind)


def names() -> tuple[str, ...]:
    """Registered metric names, built-in ones first in the paper's order."""
    load_plugins()
    return tuple(_REGISTRY)


def check_granularity(among, granularity: str) -> None:
    """A one-line error when a metric of ``among`` cannot rank at ``granularity``."""
    for name in among:
        entry = get(name)
        if granularity not in entry.granularities:
            raise Refusal(f"metric '{name}' scores keys with the heads combined, so it ranks at "
                          f"--granularity {' or '.join(entry.granularities)} only; pass "
                          f"--granularity token or leave it out of --metrics")


def order(among) -> tuple[str, ...]:
    """``among`` sorted in registry order (unknown names last, as given)."""
    known = [m for m in names() if m in among]
    return tuple(known + [m for m in among if m not in known])


_PLUGINS: dict = {"loaded": False, "failed": {}}      # failed: entry point name -> why


def load_plugins() -> None:
    """Call every ``attngeom.metrics`` entry point once (each registers its metrics).

    A plugin that fails (to import, or to register) is left out and named in one line on
    stderr: the built-in metrics and the other plugins keep working; asking for one of its
    metrics is then the error "unknown metric". ``failed_plugins()`` lists them.
    """
    if _PLUGINS["loaded"]:
        return
    _PLUGINS["loaded"] = True
    from importlib.metadata import entry_points

    for ep in entry_points(group="attngeom.metrics"):
        try:
            ep.load()()
        except Exception as exc:  # noqa: BLE001 - whatever a third party's code raises
            why = " ".join(str(exc).split())[:200] or type(exc).__name__
            _PLUGINS["failed"][ep.name] = f"{type(exc).__name__}: {why}"
            print(f"attngeom: warning: metric plugin '{ep.name}' ({ep.value}) failed to load "
                  f"and is left out ({type(exc).__name__}: {why}); fix or uninstall it",
                  file=sys.stderr)


def failed_note() -> str:
    """``"; plugin 'P' failed to load (why)"`` for each plugin that failed, appended to an
    error about a metric that is not registered (it may be one of theirs)."""
    return "".join(f"; plugin '{p}' failed to load ({why})"
                   for p, why in failed_plugins().items())


def failed_plugins() -> dict[str, str]:
    """Entry points of the ``attngeom.metrics`` group that failed to load, with why."""
    load_plugins()
    return dict(_PLUGINS["failed"])


def _builtin(name, symbol, words, short, abbrev, paper, color, **kw) -> Metric:
    return register(Metric(name, symbol, words, short, abbrev, paper, color=color, builtin=True,
                           **kw))


# In the paper's expected order of faithfulness (attention < value-weighted < output-normalized
# < contribution), then the layer-level C. Error units: ten times the largest float32 error
# ratio measured on SmolLM2-135M prose (benchmarks/RESULTS.md), in the units of each kernel's
# error model (extract/faithfulness/removal_scores.py); within units the same for the error
# within a head's row, on SmolLM2-135M, Gemma 3 270M and Qwen2.5-0.5B prose
# (benchmarks/bench_row_error.py: largest 4.86, Qwen2.5-0.5B at T = 128). contribution's unit
# is ten times its largest ratio on SmolLM2-135M at T = 128, 512 and 4,096 (1.29, T = 512:
# benchmarks/bench_contribution_bound.py; Gemma 3 270M 0.91; one layer of Qwen2.5-0.5B 4.29);
# value_weighted_normalized's, in the same model, ten times 3.37 (SmolLM2-135M at T = 4,096;
# 2.69 at 512, 2.30 at 128; Gemma 3 270M 1.90, Qwen2.5-0.5B 3.85 at 512).
_builtin(
    "attention", "α", "attention", "attention", "raw", "raw attention", "#8c8c8c",
    nonnegative=True, error_unit=32.0, within_unit=50.0)
_builtin(
    "value_weighted", "α‖ṽ‖", "value-weighted", "value-weighted", "vw",
    "value-weighted attention (Kobayashi et al. 2020)", "#4c72b0",
    nonnegative=True, error_unit=32.0, within_unit=50.0)
_builtin(
    "value_weighted_normalized", "α‖ṽ‖/‖o‖", "value-weighted normalized", "normalized", "vwn",
    "value-weighted output-normalized attention", "#55a868", nonnegative=True, error_unit=34.0,
    ranks_like=((HEAD, "value_weighted", "at head granularity value_weighted_normalized ranks "
                 "keys exactly as value_weighted (1/||o_i^h|| is constant within a head and "
                 "query)"),))
_builtin(
    "contribution", "c", "contribution", "contribution", "contrib", "contribution weights",
    "#c44e52", error_unit=13.0)
_builtin(
    "contribution_layer", "C", "layer contribution", "layer contribution", "contrib_layer",
    "layer-level contribution weights", "#8172b2", error_unit=12.0, scope=LAYER)

_builtin(
    "random", "rand", "random", "random", "rand", "a seeded random ranking (the floor)",
    "#bbbbbb", nonnegative=True, error_unit=0.0, needs=(POSITION,))
# the field's methods through attention (issue 43): scores per (query, key), heads combined;
# error units ten times the largest measured on SmolLM2-135M prose (4 texts, every layer, T = 32,
# 64 and 128: benchmarks/bench_field.py, benchmarks/RESULTS.md), and at least twice the largest
# on the tests' tiny random models (norm_residual: 0.076 there)
_builtin(
    "alti", "ALTI", "ALTI", "ALTI", "alti", "ALTI (Ferrando et al. 2022)", "#dd8452",
    nonnegative=True, error_unit=0.15, scope=TOKEN, needs=(RESIDUAL,))
_builtin(
    "alti_sa", "ALTI-sa", "ALTI, self key by its attention", "ALTI (sa)", "alti_sa",
    "ALTI, the self key ranked by its attention part only", "#f0b27a", nonnegative=True,
    error_unit=0.15, scope=TOKEN, needs=(RESIDUAL,))
_builtin(
    "norm_residual", "‖T‖", "norm with residual", "norm + residual", "nres",
    "norm-based with residual and LN (Kobayashi et al. 2021)", "#937860", nonnegative=True,
    error_unit=0.2, scope=TOKEN, needs=(RESIDUAL,))
_builtin(
    "norm_residual_sa", "‖T‖-sa", "norm with residual, self key by its attention",
    "norm + residual (sa)", "nres_sa", "norm-based, the self key ranked by its attention "
    "part only", "#c9b29b", nonnegative=True, error_unit=0.2, scope=TOKEN, needs=(RESIDUAL,))
_builtin(
    "rollout", "roll", "attention rollout", "rollout", "roll",
    "attention rollout (Abnar and Zuidema 2020)", "#da8bc3", nonnegative=True, error_unit=0.8,
    scope=TOKEN, needs=(BELOW,))
# value zeroing (issue 44): the layer's output recomputed with each key's values zeroed; about
# T / 2 passes of the layer per layer, so not among DEFAULT (budget: extract/loading/budget.py);
# error unit ten times the largest measured, rounded up: 8.04 on SmolLM2-135M prose (1 text,
# every layer, T = 128: benchmarks/bench_field.py, benchmarks/RESULTS.md; was 80, under 80.4)
_builtin(
    "value_zeroing", "VZ", "value zeroing", "value zeroing", "vz",
    "value zeroing (Mohebbi et al. 2023)", "#64b5cd", nonnegative=True, error_unit=90.0,
    scope=TOKEN, needs=(SUBLAYER,))

BUILTIN = tuple(_REGISTRY)
PAPER_ORDER = BUILTIN[:4]          # the order the paper expects, tested step by step
RANDOM = "random"                  # the floor every curve is read against
DEFAULT = BUILTIN[:5] + (RANDOM,)  # `attngeom faithfulness` runs these unless told otherwise
FIELD = ("alti", "alti_sa", "norm_residual", "norm_residual_sa", "rollout",
         "value_zeroing")                                                     # token only
NONNEGATIVE_REASON = "the score is non-negative, so |score| ranks as score"
