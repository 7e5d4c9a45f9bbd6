"""attngeom's value zeroing against the authors' code (BERT) and inseq's (SmolLM2-135M).

Not a test: it needs the authors' repository (not vendored) and a Python with inseq::

    git clone https://github.com/hmohebbi/ValueZeroing /tmp/vz     # or a bare mirror
    python benchmarks/compare_value_zeroing.py --repo /tmp/vz \\
        --inseq-python benchmarks/peers/.venv-inseq/bin/python

**The authors** (hmohebbi/ValueZeroing, ``modeling/customized_modeling_bert.py``, the layer
classes as released, run with their ``zero_value_index``; the module's header imports, written
for transformers 4.15, are stood in for), on all-MiniLM-L6-v2 (the built-in ``minilm-l6``, a
BERT encoder: post-LN, output bias): their ``BertLayer`` per layer holding MiniLM's weights,
their ``demo.py`` loop (the layer's input is the previous layer's original output, every token
zeroed in turn), ``cosine_distances`` (sklearn's formula, written here in numpy: sklearn is not
installed) in float32, scores divided by their row sum, and their ``compute_joint_attention``
(res=False) for the rollout.

**inseq** (``inseq.load_model(model, "value_zeroing")``, run in the Python given, on
SmolLM2-135M in float32 with eager attention): its decoder scores per layer (query, key), which
it thresholds (distances below 1e-5 set to 0) and divides by their row sum; its last layer's
output is the model's final hidden state, after the final RMSNorm. inseq 0.7.1 expects a block
to return a tuple, as blocks did before transformers 5; the worker gives its state hook the
same extraction for a block that returns a tensor (the one change to inseq's code).

Printed: the largest absolute difference of the normalised scores (and of their rollout)
against attngeom.scores (float64), per layer where they differ in kind, with the cause named;
for inseq also attngeom's scores given inseq's threshold.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank.",
         "Attention weights alone do not say how much each token contributes.",
         "She sold the old house and moved to a small village by the sea.",
         "In 1905 Einstein published four papers that changed physics."]
THRESHOLD = 1e-5                     # inseq's min_score_threshold


# ------------------------------------------------------------------------------ the authors'
def _authors_layer(repo: Path):
    """Their BertLayer class (and the classes it builds), from their file as released."""
    import torch
    from torch import nn
    from transformers.activations import ACT2FN

    path = repo / "modeling" / "customized_modeling_bert.py"
    text = path.read_text() if path.is_file() else subprocess.run(
        ["git", "--git-dir", str(repo), "show", "HEAD:modeling/customized_modeling_bert.py"],
        capture_output=True, text=True, check=True).stdout
    keep = ("BertSelfAttention", "BertSelfOutput", "BertAttention", "BertIntermediate",
            "BertOutput", "BertLayer")
    tree = ast.parse(text)
    body = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in keep]

    def chunked(fn, chunk_size, dim, *tensors):            # chunk_size 0 in MiniLM: one call
        assert chunk_size == 0
        return fn(*tensors)

    scope = {"torch": torch, "nn": nn, "math": math, "ACT2FN": ACT2FN,
             "apply_chunking_to_forward": chunked, "find_pruneable_heads_and_indices": None,
             "prune_linear_layer": None}
    exec(compile(ast.Module(body, []), str(path), "exec"), scope)
    return scope["BertLayer"]


def cosine_distances(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """sklearn.metrics.pairwise.cosine_distances: 1 - normalize(x) normalize(y)^T, clipped to
    [0, 2], in the inputs' dtype."""
    xn = x / np.sqrt(np.einsum("ij,ij->i", x, x))[:, None]
    yn = y / np.sqrt(np.einsum("ij,ij->i", y, y))[:, None]
    return np.clip(1 - xn @ yn.T, 0, 2)


def compute_joint_attention(att_mat):
    """Their rollout helper with res=False (demo.py)."""
    joint = np.zeros(att_mat.shape)
    joint[0] = att_mat[0]
    for i in range(1, len(att_mat)):
        joint[i] = att_mat[i].dot(joint[i - 1])
    return joint


def authors(encoder, layer_class, ids: list[int], dtype=None, distance=np.float32
            ) -> np.ndarray:
    """Their layer-wise value zeroing scores (L, T, T) of one text (demo.py's loop): their
    layers in ``dtype`` (default: the model's, float32), the distances in ``distance``."""
    import torch

    cfg = encoder.config
    layers = []
    for own in encoder.encoder.layer:
        theirs = layer_class(cfg)
        theirs.load_state_dict(own.state_dict())
        layers.append(theirs.eval() if dtype is None else theirs.to(dtype).eval())
    inputs = torch.tensor([ids])
    with torch.no_grad():
        hidden = [encoder.embeddings(input_ids=inputs)]
        hidden[0] = hidden[0] if dtype is None else hidden[0].to(dtype)
        mask = torch.zeros(1, 1, 1, len(ids), dtype=hidden[0].dtype)    # no padding
        for layer in layers:
            hidden.append(layer(hidden[-1], attention_mask=mask)[0])
        T = len(ids)
        score = np.zeros((len(layers), T, T))
        for n, layer in enumerate(layers):
            for t in range(T):
                out = layer(hidden[n], attention_mask=mask, output_attentions=False,
                            zero_value_index=t)[0]
                x, y = out[0].numpy().astype(distance), hidden[n + 1][0].numpy().astype(distance)
                score[n, :, t] = cosine_distances(x, y).diagonal()
    return score / score.sum(-1, keepdims=True)


RUNS = {"as released (float32 layers, float32 distances)": (None, np.float32),
        "their float32 layers, distances in float64": (None, np.float64),
        "their code in float64 (layers and distances)": ("float64", np.float64)}


def compare_authors(repo: Path, n: int) -> list[str]:
    import torch

    import attngeom
    from attngeom.extract.loading.models import load

    loaded = load("minilm-l6", device="cpu", dtype="float32")
    encoder, tok = loaded.model.eval(), loaded.tokenizer
    layer_class = _authors_layer(repo)
    encoder64 = copy.deepcopy(encoder).double()
    runs = {**RUNS, "their code in float64, attngeom on the model in float64 (the same "
            "layer inputs)": ("float64", np.float64)}
    worst = {run: [0.0, 0.0] for run in runs}
    methods = ("value_zeroing", "value_zeroing_rollout")
    for text in TEXTS[:n]:
        ids = tok(text)["input_ids"]
        ours32 = attngeom.scores(encoder, [ids], methods=methods)
        ours64 = attngeom.scores(encoder64, [ids], methods=methods)
        for run, (dtype, distance) in runs.items():
            theirs = authors(encoder if dtype is None else encoder64, layer_class, ids,
                             None if dtype is None else getattr(torch, dtype), distance)
            ours = ours64 if run not in RUNS else ours32
            worst[run][0] = max(worst[run][0], float(np.abs(
                ours["value_zeroing"].values[0] - theirs).max()))
            worst[run][1] = max(worst[run][1], float(np.abs(
                ours["value_zeroing_rollout"].values[0] - compute_joint_attention(theirs)).max()))
    return [f"\n### attngeom.scores (float64) vs hmohebbi/ValueZeroing on minilm-l6 ({n} texts, "
            "6 layers, every query and key: the largest absolute difference of the normalised "
            "scores)\n", "| their run | value_zeroing | value_zeroing_rollout |", "|---|---|---|",
            *(f"| {run} | {a:.3g} | {b:.3g} |" for run, (a, b) in worst.items())]


# ------------------------------------------------------------------------------ inseq
def inseq_worker(model_dir: str, texts: list[str], out: str) -> None:
    """Run in a Python with inseq: its scores and the token ids it attributed, to ``out``."""
    import inseq
    import torch
    from inseq.attr.feat.ops.value_zeroing import ValueZeroing

    released = ValueZeroing.get_states_extract_and_patch_hook

    def tensor_or_tuple(self, block_idx: int, hidden_state_idx: int = 0):
        """inseq 0.7.1's hook expects a block to return a tuple (transformers < 5); a block of
        transformers 5 returns the tensor: the same extraction and patch for it."""
        tuple_hook = released(self, block_idx, hidden_state_idx)

        def hook(module, args, output):
            if isinstance(output, tuple):
                return tuple_hook(module, args, output)
            self.corrupted_block_output_states[block_idx] = output.clone().float().detach().cpu()
            return self.clean_block_output_states[block_idx].to(output.device)
        return hook

    ValueZeroing.get_states_extract_and_patch_hook = tensor_or_tuple
    model = inseq.load_model(model_dir, "value_zeroing", model_kwargs={
        "attn_implementation": "eager", "dtype": torch.float32})
    tok = model.tokenizer
    saved = {}
    for k, text in enumerate(texts):
        ids = tok(text)["input_ids"]
        res = model.attribute(tok.decode(ids[:1]), tok.decode(ids), show_progress=False,
                              skip_special_tokens=False)
        attr = res.sequence_attributions[0]
        saved[f"scores{k}"] = attr.target_attributions.float().numpy()   # (key, query, layer)
        saved[f"ids{k}"] = np.array([t.id for t in attr.target])
    np.savez(out, **saved)


def compare_inseq(python: str, n: int) -> list[str]:
    import attngeom
    from attngeom.extract.loading.models import load

    loaded = load("smollm2-135m", device="cpu", dtype="float32")
    model = loaded.model.eval()
    model_dir = str(Path(loaded.info.get("path") or _cached_dir(loaded)))
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "inseq.npz")
        run = subprocess.run([python, __file__, "--inseq-worker", model_dir, out,
                              json.dumps(TEXTS[:n])], capture_output=True, text=True)
        if run.returncode:
            return [f"\ninseq did not run ({python}): " + run.stderr.strip().splitlines()[-1]]
        got = dict(np.load(out))
    L = len(model.model.layers)
    below = {"as published": 0.0, "threshold 1e-5 applied to attngeom": 0.0}
    last = dict(below)
    zero_share, shapes = [], set()
    for k in range(n):
        ids = got[f"ids{k}"].tolist()
        # inseq: (key, step, layer); step t generates token t + 1 from query t, so the steps
        # are the queries 0 .. T - 2 (the last query generates nothing)
        theirs = np.nan_to_num(got[f"scores{k}"].transpose(2, 1, 0))    # (layer, query, key)
        shapes.add(theirs.shape)
        T = len(ids)
        ours = attngeom.scores(model, [ids], methods=("value_zeroing",))
        raw = ours["value_zeroing"].values[0][:, :T - 1]                 # normalised
        variants = {"as published": raw,
                    "threshold 1e-5 applied to attngeom": _threshold(
                        _raw_scores(model, ids))[:, :T - 1]}
        for name, x in variants.items():
            d = np.abs(x - theirs)
            below[name] = max(below[name], float(d[:L - 1].max()))
            last[name] = max(last[name], float(d[L - 1].max()))
        zero_share.append(float((theirs[:, np.tril(np.ones(theirs.shape[1:])) > 0] == 0)
                                .mean()))
    return [f"\n### attngeom.scores vs inseq's value_zeroing on smollm2-135m ({n} texts, "
            f"{L} layers, every query and key; inseq float32, attngeom float64; inseq shapes "
            f"{sorted(shapes)})\n",
            "| attngeom | layers 0-28: max abs difference | layer 29 (inseq: after the final "
            "norm) |", "|---|---|---|",
            *(f"| {k} | {below[k]:.3g} | {last[k]:.3g} |" for k in below),
            f"\ninseq scores exactly 0 (lower triangle, its threshold): "
            f"{100 * np.mean(zero_share):.1f}% of the entries"]


def _threshold(raw: np.ndarray) -> np.ndarray:
    """Distances with inseq's threshold (below 1e-5: 0), then divided by their row sum."""
    raw = np.where(raw < THRESHOLD, 0.0, raw)
    total = raw.sum(-1, keepdims=True)
    return np.divide(raw, total, out=np.zeros_like(raw), where=total > 0)


def _raw_scores(model, ids) -> np.ndarray:
    """attngeom's float64 distances (L, T, T) before normalisation: attngeom.scores with its
    row normalisation stood in for by the identity (here only)."""
    import attngeom
    import attngeom.extract.faithfulness.attribution as A

    keep = A._normalised
    A._normalised = lambda x: x
    try:
        return attngeom.scores(model, [ids], methods=("value_zeroing",))[
            "value_zeroing"].values[0]
    finally:
        A._normalised = keep


def _cached_dir(loaded) -> str:
    """The folder the built-in model's converted weights are cached in (config + safetensors)."""
    root = Path.home() / ".cache" / "attngeom" / "models"
    return str(next(p for p in sorted(root.iterdir()) if p.name.startswith("SmolLM2-135M")))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--inseq-worker":
        inseq_worker(sys.argv[2], json.loads(sys.argv[4]), sys.argv[3])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, help="a checkout (or bare mirror) of "
                   "hmohebbi/ValueZeroing")
    p.add_argument("--inseq-python", help="a Python with inseq installed")
    p.add_argument("--texts", type=int, default=len(TEXTS))
    args = p.parse_args()
    rows = []
    if args.repo:
        rows += compare_authors(args.repo, args.texts)
    if args.inseq_python:
        rows += compare_inseq(args.inseq_python, args.texts)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
