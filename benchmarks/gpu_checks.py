"""The correctness stages of ``gpu.py`` and their tolerances (``gpu.py`` says what they check).

A small random Llama (the tests' tiny llama widened to head_dim 128) and six short texts:
``extract`` on the device against the CPU float32 store (:data:`TOLERANCES`), the out-of-memory
halving of extraction and of faithfulness, and ``faithfulness`` against the hook-free float64
reference (:data:`FAITH_TOL`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from _common import log
from gpu_report import emit, fail

if TYPE_CHECKING:
    from gpu import Plan

# the correctness model: the tests' tiny llama widened to head_dim 128 (as Llama-3.1-8B)
SMALL = dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
             intermediate_size=1024, num_hidden_layers=2, initializer_range=0.05)
WORDS = [44, 12, 29, 7, 37, 20]          # words per text: 45, 13, 30, 8, 38, 21 tokens with BOS
MAX_LENGTH, BATCH = 45, 4
# per variable: (error, bfloat16 tolerance, float32 tolerance) against the CPU float32 store.
# "abs" |got - want|, "rel" |got - want| / max(|want|, 1% of the variable's largest |want|).
# bfloat16: about twice the largest error of CPU bfloat16 over 12 random small models and
# texts (2026-12-03: alpha 0.020, cosines 0.025, contributions 0.033, norms 0.023, residual 0.052).
TOLERANCES = {
    **{n: ("abs", 0.04, 1e-4) for n in ("alpha", "tail_alpha", "middle_alpha")},
    **{n: ("abs", 0.05, 1e-3) for n in (
        "cosine", "cosine_layer", "tail_cosine", "tail_cosine_layer", "sink_value_cosine",
        "sink_residual_cosine")},
    **{n: ("abs", 0.07, 1e-3) for n in (
        "contribution", "contribution_layer", "tail_contribution", "tail_contribution_layer",
        "middle_contribution", "middle_contribution_layer", "head_share")},
    **{n: ("rel", 0.05, 1e-3) for n in ("value_norm", "output_norm", "layer_output_norm")},
    "residual_norm": ("rel", 0.1, 1e-3),           # o - alpha_0 v_0: cancels
    "middle_count": ("abs", 0.0, 0.0),
}
# relative perplexity error (clean, removal) against the float64 reference: in float32 one
# near-tie (scores 3e-6 apart) that the reference's own float32 forward decides the other way
# moves a text by 1.4e-4; in bfloat16 the ranking itself moves (the removals move it 40-80%)
FAITH_TOL = {"bfloat16": (0.02, 0.25), "float32": (1e-4, 1e-3)}
FAITH_METRICS, FAITH_MODES, FAITH_FRACTION = ("attention", "contribution"), (
    "comprehensiveness", "sufficiency"), 0.5


# ------------------------------------------------------------------------------ correctness
def small_model(root: Path) -> Path:
    """The small model and its tokenizer saved under ``root``, and the texts as JSONL."""
    import numpy as np
    import torch
    from transformers import LlamaForCausalLM

    import tiny_models as tm

    cfg = tm.make_config("llama")
    cfg.update(SMALL)
    torch.manual_seed(0)
    LlamaForCausalLM._from_config(cfg, dtype=torch.float32).eval().save_pretrained(root / "small")
    tok = tm.make_tokenizer("llama")
    tok.save_pretrained(root / "small")
    rng = np.random.default_rng(0)
    words = vocabulary(tok)
    (root / "texts.jsonl").write_text("".join(
        json.dumps({"text": " ".join(rng.choice(words, n))}) + "\n" for n in WORDS))
    return root / "small"


def vocabulary(tok) -> list[str]:
    """The tokenizer's words (no special tokens) in id order (``get_vocab`` has no order)."""
    vocab = tok.get_vocab()
    return [w for w in sorted(vocab, key=vocab.get) if not w.startswith("<")]


def extract_store(root: Path, name: str, mode: str, device: str, dtype: str):
    from attngeom.extract.run import extract
    from attngeom.store.io.reader import open_store
    from attngeom.common.options.stages import ExtractConfig

    cfg = ExtractConfig(mode=mode, device=device, dtype=dtype, batch_size=BATCH,
                        max_length=MAX_LENGTH, shard_size=4)
    extract(str(root / "small"), str(root / "texts.jsonl"), root / name, cfg, progress=False)
    with open_store(root / name, derived=True) as ds:
        return ds.load(scheduler="synchronous")


def compare(got, want, dtype: str) -> list[dict]:
    """Per variable: max error, tolerance, whether the NaN cells are the same."""
    import numpy as np

    rows = []
    for name, (kind, tol_bf16, tol_fp32) in TOLERANCES.items():
        if name not in want:
            continue
        g, w = got[name].values.astype(np.float64), want[name].values.astype(np.float64)
        nan_equal = bool(np.array_equal(np.isnan(g), np.isnan(w)))
        ok = ~(np.isnan(g) | np.isnan(w))
        d = np.abs(g - w)[ok]
        if kind == "rel":
            d = d / np.maximum(np.abs(w[ok]), 0.01 * np.abs(w[ok]).max())
        err = float(d.max()) if d.size else float("nan")
        tol = tol_bf16 if dtype == "bfloat16" else tol_fp32
        rows.append({"variable": name, "error": kind, "max_error": err, "tolerance": tol,
                     "nan_cells_equal": nan_equal, "compared": int(ok.sum()),
                     "pass": nan_equal and ok.any() and err <= tol})
    return rows


def inject_oom(module, name: str, rows_of):
    """Replace ``module.name`` by a function that raises out-of-memory once, at the first call
    with more than one row; returns (restore, hits)."""
    import torch

    real, hits = getattr(module, name), []

    def once(*args, **kw):
        rows = rows_of(*args, **kw)
        if not hits and rows > 1:
            hits.append(rows)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected by gpu.py)")
        return real(*args, **kw)

    setattr(module, name, once)
    return (lambda: setattr(module, name, real)), hits


def stage_extraction(out: Path, root: Path, plan: Plan) -> None:
    import attngeom.extract.measurement.batches as batches

    base = {}
    for mode in ("compact", "dense"):
        base[mode] = extract_store(root, f"cpu-float32-{mode}", mode, "cpu", "float32")
        for dtype in ("float32", "bfloat16"):
            got = extract_store(root, f"{plan.device}-{dtype}-{mode}", mode, plan.device, dtype)
            for row in compare(got, base[mode], dtype):
                emit(out, {"section": "correctness", "mode": mode, "device": plan.device,
                           "dtype": dtype, **row})
                if not row["pass"]:
                    fail(out, f"extract {mode} {plan.device} {dtype} {row['variable']}",
                         f"max error {row['max_error']:.3g} (tolerance {row['tolerance']:g}), "
                         f"NaN cells equal: {row['nan_cells_equal']}")
    restore, hits = inject_oom(batches, "capture",
                               lambda model, batch, opts, **kw: len(batch["input_ids"]))
    try:
        got = extract_store(root, "oom-compact", "compact", plan.device, "float32")
    finally:
        restore()
    rows = compare(got, base["compact"], "float32")
    worst = max(rows, key=lambda r: r["max_error"])
    ok = hits == [BATCH] and all(r["pass"] for r in rows)
    emit(out, {"section": "oom", "stage": "extract compact float32", "device": plan.device,
               "injected_at_batch": hits, "worst_variable": worst["variable"],
               "max_error": worst["max_error"], "pass": ok})
    if not ok:
        fail(out, "extract out-of-memory halving", f"injected at {hits}, worst {worst}")


def stage_faithfulness(out: Path, root: Path, plan: Plan) -> None:
    import numpy as np
    import torch
    import xarray as xr
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.llama import modeling_llama

    import test_faithfulness_reference as ref
    from attngeom.extract.faithfulness import experiment as F
    from attngeom.common.options.stages import FaithConfig

    results = {}
    for dtype in ("float32", "bfloat16"):
        cfg = FaithConfig(metrics=FAITH_METRICS, ranks=("signed",), fractions=(FAITH_FRACTION,),
                          granularity="head", drift=False, batch_size=BATCH, block_size=6,
                          max_length=MAX_LENGTH, device=plan.device, dtype=dtype)
        restore, hits = inject_oom(F, "compute_block", lambda m, prepared, c, *a: c.batch_size)
        try:
            path = F.faithfulness(str(root / "small"), str(root / "texts.jsonl"),
                                  root / f"faith-{dtype}", cfg, progress=False, log=log)
        finally:
            restore()
        emit(out, {"section": "oom", "stage": f"faithfulness {dtype}", "device": plan.device,
                   "injected_at_batch": hits, "pass": hits == [BATCH]})
        if hits != [BATCH]:
            fail(out, f"faithfulness {dtype} out-of-memory halving", f"hits {hits}")
        with xr.open_dataset(path, engine="h5netcdf") as f:
            results[dtype] = f.load()
    model = AutoModelForCausalLM.from_pretrained(root / "small", attn_implementation="eager",
                                                 dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(root / "small")
    texts = [json.loads(x)["text"] for x in (root / "texts.jsonl").read_text().splitlines()]
    ids = [tok(t)["input_ids"][:MAX_LENGTH] for t in texts]
    conditions = [("clean", "", None)] + [(m, mode, FAITH_FRACTION) for m in FAITH_METRICS
                                          for mode in FAITH_MODES]
    eager, clean = modeling_llama.eager_attention_forward, None
    for metric, mode, p in conditions:
        if p is not None:
            modeling_llama.eager_attention_forward = ref._intervened_eager(metric, mode, p)
        try:
            want = np.array([ref._reference_ppl(model, x) for x in ids])
        finally:
            modeling_llama.eager_attention_forward = eager
        clean = want if clean is None else clean
        moved = float(np.abs(want / clean - 1).max())     # what the check could miss
        for dtype, ds in results.items():
            got = (ds["clean_ppl"] if p is None else ds["ppl"].sel(
                metric=metric, rank="signed", mode=mode, fraction=p)).values
            err = float(np.abs(got / want - 1).max())
            tol = FAITH_TOL[dtype][p is not None]
            emit(out, {"section": "faithfulness", "device": plan.device, "dtype": dtype,
                       "metric": metric, "mode": mode, "fraction": p, "max_rel_error": err,
                       "tolerance": tol, "reference_moved": moved, "pass": err <= tol})
            if not err <= tol:
                fail(out, f"faithfulness {dtype} {metric} {mode}", f"{err:.3g} > {tol:g}")
