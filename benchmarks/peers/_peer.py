"""What the peer scripts share: their command line, the texts, the geometry, the results.

Each peer script (``peer_*.py`` beside this file) is the script a researcher writes with one tool,
as that tool's documentation teaches it; what differs between tools is how the attention
module's internals are captured. This module holds what does not depend on the tool, so that
every peer computes the same numbers in the same way once the internals are in hand:

- the command line (model directory, texts, max length, batch size, threads, keep or discard,
  ``--save`` for the correctness check);
- the texts: the first ``--limit`` non-empty ``text`` fields of a JSONL file, as
  ``attngeom extract --data FILE --limit N`` reads them;
- :func:`geometry`: from one layer's attention weights alpha, its values v and the heads'
  outputs z before the output projection (head space), and W_O, the quantities attngeom's
  dense store holds per layer and head: alpha, the projected value norms ||v~_j||, the cosines
  of the projected values to the head output cos(o_i, v~_j) and the contribution weights
  c_ij = alpha_ij <o_i, v~_j> / ||o_i||^2 (= alpha ||v~_j|| cos / ||o_i||), for every query
  and key, in model space (v~_j^h = v_j^{g(h)} W_O^h, o_i^h = z_i^h W_O^h);
- :class:`Results`: ``keep`` holds every layer's results in memory (what a researcher who
  analyses them afterwards holds), ``discard`` drops each as soon as it is computed (the least
  any tool can do); ``--save`` writes them to an ``.npz`` file (numpy, no pickle) for
  ``check.py``.

Every peer prints one JSON line: what it measured, how long the model load and the measurement
took, and how many bytes of results it held.

This file needs torch and numpy only; it runs in the peers' own environment
(``benchmarks/peers/setup.sh``), never imported by attngeom.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

PAIR = ("alpha", "cosine", "contribution")           # (batch, head, query, key)
PER_TOKEN = ("value_norm", "output_norm")            # (batch, head, key) and (batch, head, query)


def parse(description: str, extra=None) -> argparse.Namespace:
    """The peers' common command line (``extra(parser)`` adds a script's own options)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", required=True, help="a model directory (from_pretrained)")
    p.add_argument("--data", required=True, help="a JSONL file with a 'text' field")
    p.add_argument("--limit", type=int, required=True, help="the first N non-empty texts")
    p.add_argument("--max-length", type=int, required=True, help="tokens per text (truncated)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--results", choices=("keep", "discard"), default="keep",
                   help="keep every layer's results in memory, or drop each once computed")
    p.add_argument("--save", help="write the results to this .npz file (implies keep)")
    if extra:
        extra(p)
    a = p.parse_args()
    if a.save:
        a.results = "keep"
    if a.threads:
        torch.set_num_threads(a.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")      # the model is a local directory
    return a


def texts(path: str, limit: int) -> list[str]:
    """The first ``limit`` non-empty ``text`` fields of a JSONL file."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line).get("text") if line.strip() else None
            if text and text.strip():
                out.append(text)
                if len(out) == limit:
                    break
    return out


def chunks(items: list, size: int):
    """``items`` in consecutive batches of ``size`` (the last one shorter)."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


def tokenize(tokenizer, batch: list[str], max_length: int) -> dict[str, torch.Tensor]:
    """The tokenizer's own encoding (its special tokens, truncated to ``max_length``), padded
    on the right as attngeom pads: ``input_ids`` and ``attention_mask``, (B, T)."""
    tokenizer.padding_side = tokenizer.truncation_side = "right"   # the first T tokens
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return dict(tokenizer(batch, truncation=True, max_length=max_length, padding=True,
                          return_tensors="pt"))


def geometry(alpha: torch.Tensor, v: torch.Tensor, z: torch.Tensor,
             w_o: torch.Tensor) -> dict[str, torch.Tensor]:
    """One layer's measurements from its internals, in model space.

    Parameters
    ----------
    alpha : (B, H, T, T) attention weights after softmax and masks.
    v : (B, T, G, d_head) the values (G key-value heads; head h reads group h // (H / G)).
    z : (B, T, H, d_head) each head's output before the output projection, sum_j alpha v_j.
    w_o : (H, d_head, d) W_O^h, the output projection's rows of head h.

    Returns
    -------
    alpha, cosine, contribution : (B, H, T, T); value_norm (B, H, T) over keys;
    output_norm (B, H, T) over queries.
    """
    H, G = w_o.shape[0], v.shape[2]
    v = v.transpose(1, 2).repeat_interleave(H // G, dim=1)          # (B, H, T, d_head)
    v_tilde = v @ w_o                                               # (B, H, T, d)
    o = z.transpose(1, 2) @ w_o                                     # (B, H, T, d)
    value_norm, output_norm = v_tilde.norm(dim=-1), o.norm(dim=-1)  # (B, H, T)
    dot = o @ v_tilde.transpose(-1, -2)                             # (B, H, T, T)
    cosine = dot / (output_norm[..., :, None] * value_norm[..., None, :])
    contribution = alpha * dot / output_norm[..., :, None].square()
    return {"alpha": alpha, "cosine": cosine, "contribution": contribution,
            "value_norm": value_norm, "output_norm": output_norm}


class Results:
    """Every layer's measurements of every batch (``keep``), or none (``discard``)."""

    def __init__(self, mode: str):
        self.keep = mode == "keep"
        self.held: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.lengths: list[int] = []
        self.token_ids: list[list[int]] = []
        self.nbytes = 0

    def tokens(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Record a batch's sequences (right-padded (B, T) ids and mask), in order."""
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            self.lengths.append(int(sum(mask)))
            self.token_ids.append(ids[:self.lengths[-1]])

    def add(self, batch: int, layer: int, measures: dict[str, torch.Tensor]) -> None:
        if self.keep:
            self.held[batch, layer] = {k: x.detach() for k, x in measures.items()}
            self.nbytes += sum(x.numel() * x.element_size() for x in measures.values())

    def save(self, path: str) -> None:
        """(sequence, layer, head, query, key) and (sequence, layer, head, position) float32
        arrays, NaN beyond each sequence's length, in an ``.npz`` file; plus ``length`` and
        ``token_id`` (sequence, position; -1 beyond the length)."""
        batches = sorted({b for b, _ in self.held})
        layers = sorted({layer for _, layer in self.held})
        T = max(self.lengths)
        out = {}
        present = set().union(*(m.keys() for m in self.held.values()))
        for name in [n for n in PAIR + PER_TOKEN if n in present]:
            rows = []
            for b in batches:
                x = torch.stack([self.held[b, layer][name] for layer in layers], 1).float()
                pad = [(0, 0)] * (x.dim() - 1) + [(0, T - x.shape[-1])]
                if name in PAIR:
                    pad[-2] = (0, T - x.shape[-2])
                rows.append(np.pad(x.numpy(), pad, constant_values=np.nan))
            out[name] = np.concatenate(rows)
        n = np.asarray(self.lengths, dtype=np.int64)
        for name, x in out.items():                  # NaN beyond each sequence's length
            for s, length in enumerate(n):
                x[s, ..., length:] = np.nan
                if name in PAIR:
                    x[s, ..., length:, :] = np.nan
        ids = np.full((len(n), T), -1, dtype=np.int64)
        for s, row in enumerate(self.token_ids):
            ids[s, :len(row)] = row
        np.savez(path, length=n, token_id=ids, **out)


def report(peer: str, args: argparse.Namespace, load_s: float, measure_s: float,
           results: Results, **more) -> None:
    """One JSON line: the peer, the case, the load and measurement seconds, bytes held."""
    print(json.dumps({"peer": peer, "texts": len(results.lengths),
                      "tokens": int(sum(results.lengths)), "max_length": args.max_length,
                      "batch_size": args.batch_size, "results": args.results,
                      "threads": torch.get_num_threads(), "load_s": load_s,
                      "measure_s": measure_s, "held_bytes": results.nbytes,
                      "torch": torch.__version__, **more}), flush=True)


def clock() -> float:
    return time.perf_counter()


def fail(message: str) -> None:
    """One line on stderr, exit status 2 (a peer that cannot do the case)."""
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    sys.exit(2)
