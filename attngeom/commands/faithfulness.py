"""``attngeom faithfulness``: remove the keys each metric ranks first/last and measure the loss."""

from __future__ import annotations

from attngeom.common.options.commands import FaithCommand
from attngeom.common.options.stages import FaithConfig, add_arguments, from_args


def check_data(cfg: FaithConfig, data: str) -> None:
    """Parse the texts or task items once before torch loads: bad files fail fast."""
    from attngeom.extract.loading.tasks import load

    if not load(cfg.task, data, cfg)[0]:
        raise ValueError(f"--data {data} holds no {cfg.task} text or item; "
                         "give a file with some")


def add_parser(p) -> None:
    add_arguments(p, FaithCommand)
    add_arguments(p, FaithConfig)


def run(args) -> int:
    import time

    from .extract import check_model, check_out, use_threads

    cmd, cfg = from_args(args, FaithCommand), from_args(args, FaithConfig)
    cfg.check()                                  # everything checkable before torch loads
    check_model(cmd.model, cfg.dtype, cfg.device)
    check_out(cmd.out)
    check_data(cfg, cmd.data)
    use_threads(cmd.threads)
    from attngeom.extract.faithfulness.experiment import faithfulness

    from attngeom.analysis.faithfulness_stats import for_store

    t0 = time.perf_counter()
    path = faithfulness(cmd.model, cmd.data, cmd.out, cfg,
                        trust_remote_code=cmd.trust_remote_code, progress=not cmd.quiet,
                        force=cmd.force, beyond_context=cmd.beyond_context)
    print(f"wrote {path} ({time.perf_counter() - t0:.1f} s)")
    stats, ds, why = for_store(cmd.out, cfg.name)
    if stats is None:
        raise ValueError(f"{path}: {why}; rerun with --force")
    print(summarize(ds, stats))
    return 0


ORDER_SHOWN = ["mode", "rank", "lower", "higher", "mean_improvement", "ci_low", "ci_high",
               "p_holm", "mde", "p_tost", "verdict", "note"]


def summarize(ds, stats) -> str:
    """The run's stored statistics as text: mean loss per condition, AOPC and the order."""
    import pandas as pd

    loss = stats.attrs["loss_variable"]
    unit = ds.attrs["unit_dim"]
    lines = [f"task {ds.attrs['task']}, granularity {ds.attrs['granularity']}, "
             f"{ds.sizes[unit]} {unit}s, loss = {loss}; statistics stored in "
             f"{stats.attrs['source']}_stats (level {stats.attrs['level']:g}, "
             f"{stats.attrs['n_resamples']} bootstrap resamples, seed {stats.attrs['seed']})"]
    notes = [n for n in str(ds.attrs.get("notes", "")).splitlines() if n]
    if notes:
        lines += ["identical rankings (results copied, not recomputed):"] + notes
    clean = ds["clean_ppl"] if "clean_ppl" in ds else ds["clean_accuracy"]
    lines.append(f"clean: mean {clean.name} {float(clean.mean()):.4g}")
    curve = stats.curves.attrs["curve_variable"]
    with pd.option_context("display.width", 200, "display.max_columns", 20,
                           "display.float_format", "{:.4g}".format):
        mean = stats.curves["curve_mean"].to_dataframe()["curve_mean"].unstack(
            ["rank", "fraction"])
        lines += [f"mean {curve} by rank and fraction:", mean.to_string()]
        aopc = stats.for_variable(stats.aopc)
        table = aopc.pivot_table(index="metric", columns=["mode", "rank"], values="aopc_mean",
                                 sort=False)
        modes, ranks = (list(dict.fromkeys(aopc[c])) for c in ("mode", "rank"))
        table = table[[(m, r) for m in modes for r in ranks]]
        lines += [f"AOPC of {loss} (mean over fractions, then over units; signed and "
                  "magnitude ranking side by side):", table.to_string()]
        for variable in dict.fromkeys(stats.order["variable"]):
            order = stats.for_variable(stats.order, variable)
            if order.empty:
                lines.append("metric order: not tested (it needs two or more of the paper's "
                             "metrics)")
                break
            lines += [f"metric order on the AOPC of {variable} (improvement > 0 means the step "
                      f"holds in the paper's direction; MDE and TOST at δ = "
                      f"{order['delta'].iloc[0]:.4g}):", order[ORDER_SHOWN].to_string(index=False)]
        if stats.drift is not None:
            d = stats.drift
            lines.append(f"semantic drift (sink values zeroed): mean {d.attrs['loss_variable']} "
                         f"{d.attrs['loss_mean']:.4g}, p = {d.attrs['loss_p_value']:.3g}; "
                         f"low-norm cone cosine {float(d['cosine_low_before_mean'].mean()):.3f} "
                         f"-> {float(d['cosine_low_after_mean'].mean()):.3f} (layer mean)")
    return "\n".join(lines)
