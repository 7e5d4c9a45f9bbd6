"""``attngeom faithfulness``: remove the keys each metric ranks first/last and measure the loss."""

from __future__ import annotations

METRICS = ("attention", "value_weighted", "value_weighted_normalized", "contribution",
           "contribution_layer")


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _fractions(text: str) -> tuple[float, ...]:
    """``"0.1,0.5"`` -> (0.1, 0.5); ValueError unless distinct numbers in [0, 1]."""
    try:
        values = tuple(float(t) for t in _names(text))
    except ValueError:
        raise ValueError(f"--fractions '{text}': give comma-separated numbers such as "
                         "0.1,0.2,0.5") from None
    if not values or any(not 0 <= p <= 1 for p in values) or len(set(values)) != len(values):
        raise ValueError(f"--fractions '{text}': give distinct numbers in [0, 1], e.g. 0.1,0.2,0.5")
    return values


def check_data(args) -> None:
    """Parse the texts or task items once before torch loads: bad files fail fast."""
    from attngeom.extract import tasks
    from attngeom.extract.data import load_texts

    if args.task == "lm":
        found = len(load_texts(args.data, text_field=args.text_field, limit=args.limit))
    else:
        loader = {"gsm8k-answer": tasks.gsm8k_items, "mmlu": tasks.mmlu_items,
                  "winogrande": tasks.winogrande_items, "boolq": tasks.boolq_items}[args.task]
        found = len(loader(args.data, limit=args.limit))
    if not found:
        raise ValueError(f"--data {args.data} holds no {args.task} text or item; "
                         "give a file with some")


def check_args(args) -> tuple[float, ...]:
    """Everything checkable without torch; returns the removal fractions."""
    from .extract import check_at_least_one, check_model, check_out

    check_at_least_one(args, ("max_length", "batch_size", "block_size", "sink_k", "limit"))
    if args.k_shot < 0:
        raise ValueError(f"--k-shot must be 0 or more, not {args.k_shot}")
    fractions = _fractions(args.fractions)
    if not 0 < args.drift_low_fraction <= 1:
        raise ValueError(f"--drift-low-fraction {args.drift_low_fraction} must be in (0, 1]")
    parse_layers(args.layers)
    check_model(args)
    check_out(args.out)
    check_data(args)
    return fractions


def parse_layers(text: str | None) -> tuple[int, ...] | None:
    """``"0,2,5-7"`` -> (0, 2, 5, 6, 7); None or ``"all"`` -> None."""
    if text is None or text.strip() == "all":
        return None
    out: set[int] = set()
    try:
        for part in _names(text):
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(f"--layers '{text}': give layer indices such as 0,2,5-7") from None
    if not out:
        raise ValueError(f"--layers '{text}' names no layer")
    return tuple(sorted(out))


def add_parser(p) -> None:
    p.add_argument("--model", required=True,
                   help="hub id, model directory, .gguf file, or smollm2-135m/gemma3-270m")
    p.add_argument("--data", required=True, help="texts (lm) or task records (.jsonl, hf:...)")
    p.add_argument("--out", required=True,
                   help="store directory: <name>.nc is written there (created if absent)")
    p.add_argument("--task", default="lm",
                   choices=["lm", "gsm8k-answer", "mmlu", "winogrande", "boolq"])
    p.add_argument("--metrics", default=",".join(METRICS), help="comma-separated metrics")
    p.add_argument("--modes", default="comprehensiveness,sufficiency")
    p.add_argument("--ranks", "--rank", dest="ranks", default="signed,magnitude",
                   help="signed, magnitude (rank by |score|) or both")
    p.add_argument("--fractions", default="0.1,0.2,0.5", help="removal fractions p")
    p.add_argument("--granularity", default="head", choices=["head", "query", "token"],
                   help="rank keys within each head and query (head), all (head, key) pairs "
                        "of a query (query), or head-summed scores per key (token)")
    p.add_argument("--layers", default=None, help="intervene only here, e.g. 0,2,5-7 (all)")
    p.add_argument("--limit", type=int, default=None, help="use the first N texts/items")
    p.add_argument("--max-length", type=int, default=512, help="tokens per row (truncated)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--block-size", type=int, default=16,
                   help="texts/items per checkpoint block (resume granularity)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (GPU)")
    p.add_argument("--text-field", default=None, help="field of JSONL/Parquet records (lm)")
    p.add_argument("--dev", default=None,
                   help="MMLU exemplars (default: mmlu_dev.jsonl next to mmlu_test.jsonl)")
    p.add_argument("--k-shot", type=int, default=5, help="MMLU exemplars per prompt")
    p.add_argument("--no-drift", action="store_true",
                   help="skip the semantic-drift pass (sink values zeroed)")
    p.add_argument("--sink-k", type=int, default=1, help="sink keys: the first k positions")
    p.add_argument("--drift-low-fraction", type=float, default=0.1,
                   help="lowest-norm share of head outputs whose cone alignment is reported")
    p.add_argument("--name", default="faithfulness", help="result file <name>.nc")
    p.add_argument("--force", action="store_true",
                   help="start over: replace an existing result or interrupted run")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow model code from the hub (off by default)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    import time

    fractions = check_args(args)
    from attngeom.extract.faithfulness import FaithConfig, faithfulness

    cfg = FaithConfig(task=args.task, metrics=_names(args.metrics), modes=_names(args.modes),
                      ranks=_names(args.ranks), fractions=fractions,
                      granularity=args.granularity, layers=parse_layers(args.layers),
                      max_length=args.max_length, limit=args.limit, text_field=args.text_field,
                      dev=args.dev, k_shot=args.k_shot, drift=not args.no_drift,
                      sink_k=args.sink_k, drift_low_fraction=args.drift_low_fraction,
                      block_size=args.block_size, batch_size=args.batch_size,
                      device=args.device, dtype=args.dtype, name=args.name)
    t0 = time.perf_counter()
    path = faithfulness(args.model, args.data, args.out, cfg,
                        trust_remote_code=args.trust_remote_code, progress=not args.quiet,
                        force=args.force)
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
