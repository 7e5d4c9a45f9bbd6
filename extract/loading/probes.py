"""Probe inputs of Gu et al.'s sink protocol ("When Attention Sink Emerges", ICLR 2025):
token ids drawn directly, never decoded and re-encoded.

A probe spec is ``probe:KIND:T:N[:SEED]``: ``random`` (each of the N rows of T tokens drawn
uniformly from the tokenizer's non-special vocabulary) or ``repeated`` (row r is one such token
repeated T times), with numpy's ``default_rng(SEED)`` (default 0). No BOS unless ``bos="yes"``
(then the tokenizer's BOS and the first T - 1 tokens). The store's data identity is the spec,
the BOS choice, the ids' sha256 and the tokenizer's vocabulary fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .data import Tokenized
from attngeom.common.errors import Refusal

PROBE_KINDS = ("random", "repeated")
_SPEC = re.compile(r"^probe:(?P<kind>[a-z]+):(?P<length>\d+):(?P<n>\d+)(?::(?P<seed>\d+))?$")
PROBE_HELP = "probe:random:T:N[:SEED] or probe:repeated:T:N[:SEED]"


@dataclass(frozen=True)
class Probe:
    kind: str
    length: int
    n: int
    seed: int = 0


def is_probe(spec: str) -> bool:
    return str(spec).startswith("probe:")


def parse_probe(spec: str) -> Probe:
    """The probe a spec names; ValueError (one line) when it is malformed."""
    m = _SPEC.match(str(spec))
    if m is None or m["kind"] not in PROBE_KINDS or int(m["length"]) < 1 or int(m["n"]) < 1:
        raise Refusal(f"malformed probe spec '{spec}'; write {PROBE_HELP}, e.g. "
                         "probe:random:64:100")
    return Probe(m["kind"], int(m["length"]), int(m["n"]), int(m["seed"] or 0))


def non_special_ids(tok: Any) -> np.ndarray:
    """Token ids 0..len(tok)-1 that are not special (nor added special tokens such as Gemma's
    ``<unusedN>``)."""
    special = set(getattr(tok, "all_special_ids", []))
    special |= {i for i, t in getattr(tok, "added_tokens_decoder", {}).items() if t.special}
    return np.array([i for i in range(len(tok)) if i not in special], dtype=np.int64)


def probe_ids(probe: Probe, tok: Any, bos: bool = False) -> np.ndarray:
    """(N, T) int64 ids of ``probe`` (module docstring)."""
    vocab = non_special_ids(tok)
    rng = np.random.default_rng(probe.seed)
    if probe.kind == "random":
        ids = rng.choice(vocab, size=(probe.n, probe.length), replace=True)
    else:
        ids = np.repeat(rng.choice(vocab, size=(probe.n, 1), replace=True), probe.length, 1)
    if bos:
        bos_id = getattr(tok, "bos_token_id", None)
        if bos_id is None:
            raise Refusal("--bos yes: this tokenizer has no BOS token; use --bos no")
        ids = np.concatenate([np.full((probe.n, 1), bos_id, dtype=ids.dtype), ids[:, :-1]], 1)
    return ids


def tokenizer_fingerprint(tok: Any) -> str:
    """sha256 of the tokenizer's vocabulary (token -> id) and special ids."""
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    payload = json.dumps([vocab, sorted(getattr(tok, "all_special_ids", []))],
                         ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class ProbeSet:
    """Probe rows in the shape of :class:`~.data.TextSet` (``texts`` holds the token ids)."""

    texts: Tokenized
    spec: str
    sha256: str
    tokenizer_sha256: str
    skipped_empty: int = 0

    kind = "text"                # what a model of this data takes (its ``inputs``)

    def __len__(self) -> int:
        return len(self.texts)


def probe_set(spec: str, tok: Any, bos: bool = False) -> ProbeSet:
    """The probe rows of ``spec`` for tokenizer ``tok``."""
    ids = probe_ids(parse_probe(spec), tok, bos)
    rows = [list(map(int, r)) for r in ids]
    digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    return ProbeSet(Tokenized(rows, [False] * len(rows)), spec, digest,
                    tokenizer_fingerprint(tok))
