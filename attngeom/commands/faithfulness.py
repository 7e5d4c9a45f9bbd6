"""``attngeom faithfulness``: remove the keys each metric ranks first/last and measure the loss."""

from __future__ import annotations

from attngeom.common.errors import Refusal
from attngeom.common.options.commands import FaithCommand
from attngeom.common.options.stages import FaithConfig, add_arguments, from_args


def check_data(cfg: FaithConfig, data: str) -> None:
    """Parse the texts or task items once before torch loads: bad files fail fast."""
    from attngeom.extract.loading.tasks import load

    if not load(cfg.task, data, cfg)[0]:
        raise Refusal(f"--data {data} holds no {cfg.task} text or item; "
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
        raise Refusal(f"{path}: {why}; rerun with --force")
    print(summarize(ds, stats))
    return 0


def summarize(ds, stats) -> str:
    """The run's stored statistics as text: the tables the PDF shows
    (:func:`attngeom.reports.faithfulness_tables.tables`), then the drift summary."""
    from attngeom.reports.faithfulness_tables import as_text, tables

    unit = ds.attrs["unit_dim"]
    lines = [f"task {ds.attrs['task']}, granularity {ds.attrs['granularity']}, "
             f"{ds.sizes[unit]} {unit}s, loss = {stats.attrs['loss_variable']}; statistics "
             f"stored in {stats.attrs['source']}_stats (level {stats.attrs['level']:g}, "
             f"{stats.attrs['n_resamples']} bootstrap resamples, seed {stats.attrs['seed']})"]
    notes = [n for n in str(ds.attrs.get("notes", "")).splitlines() if n]
    if notes:
        lines += ["identical rankings (results copied, not recomputed):"] + notes
    clean = ds["clean_ppl"] if "clean_ppl" in ds else ds["clean_accuracy"]
    lines.append(f"clean: mean {clean.name} {float(clean.mean()):.4g}")
    if stats.order.empty:
        lines.append("metric order: not tested (it needs two or more of the paper's metrics)")
    lines += ["\n" + as_text(t) for t in tables(stats)]
    if stats.drift is not None:
        d = stats.drift
        lines.append(f"\nsemantic drift (sink values zeroed): mean {d.attrs['loss_variable']} "
                     f"{d.attrs['loss_mean']:.4g}, p = {d.attrs['loss_p_value']:.3g}; "
                     f"low-norm cone cosine {float(d['cosine_low_before_mean'].mean()):.3f} "
                     f"-> {float(d['cosine_low_after_mean'].mean()):.3f} (layer mean)")
    return "\n".join(lines)
