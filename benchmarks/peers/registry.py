"""The peers: which script, which environment, which arguments; the model and the texts.

Imported by ``check.py`` and ``benchmarks/bench_peers.py``, which run in attngeom's own
environment; each peer runs in its own (``setup.sh``): ``.venv`` holds torch, transformers,
TransformerLens and nnsight, ``.venv-inseq`` holds inseq (its typeguard<=2.13.3 pin conflicts
with TransformerLens' typeguard>=4.2).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DATA = REPO.parent / "shared" / "data" / "wikitext2_raw_test.jsonl"
if not DATA.is_file():                          # a worktree: /work/wt/X -> /work/shared
    DATA = REPO.parent.parent / "shared" / "data" / "wikitext2_raw_test.jsonl"
MODEL = "smollm2-135m"


@dataclass(frozen=True)
class Peer:
    script: str
    venv: str
    args: tuple[str, ...] = ()
    computes: tuple[str, ...] = ("alpha", "cosine", "contribution", "value_norm",
                                 "output_norm")
    modes: tuple[str, ...] = ("keep", "discard")       # what the harness times
    last_query_missing: bool = False                  # no row for each text's last query
    note: str = field(default="", compare=False)

    def python(self) -> Path:
        return HERE / self.venv / "bin" / "python"


PEERS: dict[str, Peer] = {
    "plain": Peer("peer_plain.py", ".venv",
                  note="transformers eager, output_attentions, hooks on v_proj / o_proj"),
    "plain-layer": Peer("peer_plain.py", ".venv", ("--layer-by-layer",), modes=("discard",),
                        note="the same, each layer measured in its attention module's hook"),
    "transformerlens": Peer("peer_transformerlens.py", ".venv",
                            note="TransformerBridge as booted (no weight processing), "
                                 "run_with_cache with a names filter"),
    "nnsight": Peer("peer_nnsight.py", ".venv",
                    note="TransformersModel, trace saving v_proj.output, o_proj.input, "
                         "self_attn.output[1]"),
    "inseq": Peer("peer_inseq.py", ".venv-inseq", computes=("alpha",), modes=("keep",),
                  last_query_missing=True,
                  note="attention method: alpha only, one text per forward"),
}


def peer_argv(name: str, model: Path, data: Path, limit: int, max_length: int,
              batch_size: int, threads: int, results: str, save: Path | None = None) -> list[str]:
    """The command line that runs peer ``name`` on a case."""
    peer = PEERS[name]
    argv = [str(peer.python()), str(HERE / peer.script), *peer.args, "--model", str(model),
            "--data", str(data), "--limit", str(limit), "--max-length", str(max_length),
            "--batch-size", str(batch_size), "--threads", str(threads), "--results", results]
    return argv + (["--save", str(save)] if save else [])


def missing_envs(names) -> list[str]:
    """The peers whose environment is not installed (run ``benchmarks/peers/setup.sh``)."""
    return [n for n in names if not PEERS[n].python().is_file()]


def model_dir() -> Path:
    """SmolLM2-135M as the safetensors directory attngeom converts its GGUF into once (under
    its cache): the same weights attngeom measures, loadable by any peer with
    ``from_pretrained(dir)``, offline."""
    from attngeom.extract.loading.models import cache_dir

    def found():
        return sorted((cache_dir() / "models").glob("SmolLM2-135M-Instruct*/config.json"))
    if not found():
        from attngeom.extract.loading.models import load
        load(MODEL)                                  # converts the GGUF into the cache
    return found()[-1].parent


def write_texts(path: Path, texts: list[str]) -> Path:
    """A JSONL file of ``{"text": ...}`` records."""
    with open(path, "w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
    return path


def long_text(tokenizer, length: int) -> tuple[str, str]:
    """One WikiText-2 text of at least ``length`` tokens: the first article that long, else the
    articles joined in order (with newlines) until the text is; and a note saying which."""
    records = [json.loads(line)["text"] for line in DATA.open(encoding="utf-8") if line.strip()]
    for i, text in enumerate(records):
        if len(tokenizer(text)["input_ids"]) >= length:
            return text, f"WikiText-2 article {i} (one article)"
    joined, n = "", 0
    for n, text in enumerate(records, 1):
        joined = f"{joined}\n{text}" if joined else text
        if len(tokenizer(joined)["input_ids"]) >= length:
            return joined, f"WikiText-2 articles 0-{n - 1} joined"
    sys.exit(f"WikiText-2 holds fewer than {length} tokens")
