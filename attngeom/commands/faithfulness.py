"""``attngeom faithfulness``: remove the keys each metric ranks first/last and measure the loss."""

from __future__ import annotations

from attngeom.store.options.stages import FaithCommand, FaithConfig, add_arguments, from_args


def check_data(cfg: FaithConfig, data: str) -> None:
    """Parse the texts or task items once before torch loads: bad files fail fast."""
    from attngeom.extract.loading import tasks
    from attngeom.extract.loading.data import load_texts

    if cfg.task == "lm":
        found = len(load_texts(data, text_field=cfg.text_field, limit=cfg.limit))
    else:
        loader = {"gsm8k-answer": tasks.gsm8k_items, "mmlu": tasks.mmlu_items,
                  "winogrande": tasks.winogrande_items, "boolq": tasks.boolq_items}[cfg.task]
        found = len(loader(data, limit=cfg.limit))
    if not found:
        raise ValueError(f"--data {data} holds no {cfg.task} text or item; "
                         "give a file with some")


def add_parser(p) -> None:
    add_arguments(p, FaithCommand)
    add_arguments(p, FaithConfig)


def run(args) -> int:
    import time

    from .extract import check_model, check_out

    cmd, cfg = from_args(args, FaithCommand), from_args(args, FaithConfig)
    cfg.check()                                  # everything checkable before torch loads
    check_model(cmd.model, cfg.dtype, cfg.device)
    check_out(cmd.out)
    check_data(cfg, cmd.data)
    from attngeom.extract.faithfulness.experiment import faithfulness

    t0 = time.perf_counter()
    path = faithfulness(cmd.model, cmd.data, cmd.out, cfg,
                        trust_remote_code=cmd.trust_remote_code, progress=not cmd.quiet,
                        force=cmd.force)
    print(f"wrote {path} ({time.perf_counter() - t0:.1f} s)")
    print(summarize(path))
    return 0


def summarize(path) -> str:
    """Mean loss per condition, AOPC and the order table, as text."""
    import pandas as pd
    import xarray as xr

    from attngeom.analysis.faithfulness import aopc_table, drift_summary, order_table

    with xr.open_dataset(path, engine="h5netcdf") as f:
        ds = f.load()
    loss = ds.attrs["loss_variable"]
    lines = [f"task {ds.attrs['task']}, granularity {ds.attrs['granularity']}, "
             f"{ds.sizes[ds.attrs['unit_dim']]} {ds.attrs['unit_dim']}s, loss = {loss}"]
    notes = [n for n in str(ds.attrs.get("notes", "")).splitlines() if n]
    if notes:
        lines += ["identical rankings (results copied, not recomputed):"] + notes
    clean = ds["clean_ppl"] if "clean_ppl" in ds else ds["clean_accuracy"]
    lines.append(f"clean: mean {clean.name} {float(clean.mean()):.4g}")
    with pd.option_context("display.width", 200, "display.max_columns", 20,
                           "display.float_format", "{:.4g}".format):
        mean = ds[loss].mean(ds.attrs["unit_dim"]).to_dataframe()[loss].unstack(
            ["rank", "fraction"])
        lines += [f"mean {loss} by rank and fraction:", mean.to_string()]
        lines += ["AOPC (mean over fractions, then over units; signed and magnitude ranking "
                  "side by side):", aopc_table(ds).to_string()]
        table = order_table(ds)
        cols = ["mode", "rank", "lower", "higher", "mean_improvement", "ci_low", "ci_high",
                "p_holm", "holds", "note"]
        if table.empty:
            lines.append("metric order: not tested (it needs two or more of the paper's metrics)")
        else:
            lines += ["metric order (improvement > 0 means the step holds in the paper's "
                      "direction):", table[cols].to_string(index=False)]
        if "drift_cosine_low_before" in ds:
            d = drift_summary(ds)
            lines.append(f"semantic drift (sink values zeroed): mean {d.attrs['loss_variable']} "
                         f"{d.attrs['loss_mean']:.4g}, p = {d.attrs['loss_p_value']:.3g}; "
                         f"low-norm cone cosine {float(d['cosine_low_before_mean'].mean()):.3f} "
                         f"-> {float(d['cosine_low_after_mean'].mean()):.3f} (layer mean)")
    return "\n".join(lines)
