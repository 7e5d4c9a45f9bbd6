"""attngeom.scores against the authors' released ALTI code (mt-upc/transformer-contributions).

Not a test: it needs a checkout of the authors' repository (it is not vendored), e.g.::

    git clone https://github.com/mt-upc/transformer-contributions /tmp/alti
    python benchmarks/compare_alti.py --repo /tmp/alti [--texts 8]

On all-MiniLM-L6-v2 (the built-in ``minilm-l6``, a BERT encoder: post-LN, output bias), their
``ModelWrapper`` (src/contributions.py, run as released; its module-level imports of captum and
pyaml_env, which the functions used here do not call, are stood in for) gives per layer the
L1 "contributions", the resultants y_i and the norms ||T_i(x_j)||; their own
``normalize_contributions`` and ``compute_joint_attention`` / ``compute_rollout``
(src/utils_contributions.py, those functions alone) normalise and roll them out exactly as
their attributions.py does. Their model is a ``BertForSequenceClassification`` carrying
MiniLM's encoder weights (their wrapper reads ``bert.encoder.layer``; the head is not used).

Printed: for each method, the largest absolute difference and the largest relative to the
score's range, attngeom (float64) against theirs (float32), with ``alti_bias=True`` (y_i with
the block's biases, as their resultant) and with attngeom's default (biases apart).
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank.",
         "Attention weights alone do not say how much each token contributes.",
         "She sold the old house and moved to a small village by the sea.",
         "In 1905 Einstein published four papers that changed physics.",
         "The committee will meet again next week to discuss the budget.",
         "Rain fell all night, and by morning the streets were flooded.",
         "A good teacher explains the same idea in several different ways.",
         "The museum reopened after two years of careful restoration work."]


def _authors(repo: Path, work: Path):
    """Their ModelWrapper and the two utility functions, from a copy of their files."""
    src = work / "src"
    src.mkdir(parents=True)
    for name in ("contributions.py", "config.yaml", "utils_contributions.py"):
        path = repo / "src" / name
        if path.is_file():
            shutil.copy(path, src / name)
        else:                                              # a bare mirror: read from git
            text = subprocess.run(["git", "--git-dir", str(repo), "show", f"HEAD:src/{name}"],
                                  capture_output=True, text=True, check=True).stdout
            (src / name).write_text(text)
    import yaml

    sys.modules["pyaml_env"] = types.SimpleNamespace(
        parse_config=lambda path: yaml.safe_load(Path(path).read_text()))
    attr = types.ModuleType("captum.attr")
    for name in ("IntegratedGradients", "Saliency", "InputXGradient",
                 "InterpretableEmbeddingBase", "TokenReferenceBase"):
        setattr(attr, name, object)
    sys.modules["captum"] = types.ModuleType("captum")
    sys.modules["captum.attr"] = attr
    cwd = os.getcwd()
    os.chdir(work)                                  # their module reads ./src/config.yaml
    try:
        sys.path.insert(0, str(src))
        import contributions                        # noqa: E402  (theirs)
    finally:
        os.chdir(cwd)
    tree = ast.parse((src / "utils_contributions.py").read_text())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in
            ("normalize_contributions", "compute_joint_attention", "compute_rollout")]
    utils = {"torch": torch, "np": np, "F": torch.nn.functional}
    exec(compile(ast.Module(keep, []), "utils_contributions.py", "exec"), utils)
    return contributions.ModelWrapper, utils


def _classifier(encoder):
    """A BertForSequenceClassification holding ``encoder``'s weights (eager attention)."""
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification._from_config(encoder.config,
                                                       attn_implementation="eager")
    model.bert.load_state_dict(encoder.state_dict(), strict=False)
    return model.float().eval()


def theirs(wrapper, utils, model, tok, text: str) -> dict:
    batch = tok(text, return_tensors="pt")
    _, _, attentions, data = wrapper(model)(batch)
    att = np.asarray([a.detach().numpy() for a in attentions])[:, 0]     # (L, H, T, T)
    resultant = torch.norm(torch.squeeze(data["resultants"]), p=1, dim=-1)
    alti = utils["normalize_contributions"](data["contributions"], scaling="min_sum",
                                            resultant_norm=resultant)
    norms = utils["normalize_contributions"](data["transformed_vectors_norm"],
                                             scaling="sum_one")
    return {"alti": alti.numpy(), "alti_rollout": utils["compute_joint_attention"](alti).numpy(),
            "norm_residual": data["transformed_vectors_norm"].numpy(),
            "norm_residual_rollout": utils["compute_joint_attention"](norms).numpy(),
            "rollout": utils["compute_rollout"](att.mean(1)).numpy(),
            "ids": batch["input_ids"][0].tolist()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", required=True, type=Path,
                   help="a checkout (or bare mirror) of mt-upc/transformer-contributions")
    p.add_argument("--texts", type=int, default=len(TEXTS))
    args = p.parse_args()
    import attngeom
    from attngeom.extract.loading.models import load

    loaded = load("minilm-l6", device="cpu", dtype="float32")
    encoder, tok = loaded.model.eval(), loaded.tokenizer
    with tempfile.TemporaryDirectory() as work:
        wrapper, utils = _authors(args.repo, Path(work))
        model = _classifier(encoder)
        worst: dict = {}
        for text in TEXTS[:args.texts]:
            ref = theirs(wrapper, utils, model, tok, text)
            for bias in (True, False):
                ours = attngeom.scores(encoder, [ref["ids"]], alti_bias=bias)
                for name in ("alti", "alti_rollout", "norm_residual", "norm_residual_rollout",
                             "rollout"):
                    if not bias and name not in ("alti", "alti_rollout"):
                        continue
                    got, want = ours[name].values[0], ref[name]
                    diff = float(np.abs(got - want).max())
                    span = float(np.ptp(want)) or 1.0
                    key = (name, bias)
                    a, r = worst.get(key, (0.0, 0.0))
                    worst[key] = (max(a, diff), max(r, diff / span))
    print(f"attngeom.scores vs mt-upc/transformer-contributions on minilm-l6, {args.texts} "
          f"texts, all layers, queries and keys")
    print(f"{'method':24s} {'y_i with biases':16s} {'max |diff|':>12s} {'max |diff| / range':>20s}")
    for (name, bias), (a, r) in worst.items():
        print(f"{name:24s} {'yes (theirs)' if bias else 'no (default)':16s} {a:12.3g} {r:20.3g}")


if __name__ == "__main__":
    main()
