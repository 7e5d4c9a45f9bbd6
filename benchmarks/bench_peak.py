"""Peak memory of one long text, run after run: ``attngeom extract`` against a plain SDPA forward.

Issue 46's case: one WikiText-2 text of ``--length`` tokens (the articles joined, as
``bench_length.py`` builds it), SmolLM2-135M. Each round runs two fresh processes, their order
alternating: the command as a user runs it, ``attngeom extract --model M --data FILE
--max-length T --batch-size 1 --no-text --quiet --out DIR`` (compact), and a plain script that
loads the same model directory with ``AutoModelForCausalLM`` (SDPA, float32) and runs its base
model over the same token ids (``model.model(ids)``: no logits). Printed per round: each
process's peak resident set (``wait4``, what ``/usr/bin/time -v`` reports as its maximum
resident set size) and wall seconds, the store's bytes, and the ratio of the peaks (target:
at most 1.3 in every round); then their min, median and max. The peak of the same process
varies from run to run (the C heap's reuse of freed blocks: ``extract/heap.py``), which is
why one run per cell says little.

    python benchmarks/bench_peak.py --model smollm2-135m --length 8192 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, json_lines, log, machine, run_child_rss  # noqa: E402
from bench_command import child_env  # noqa: E402

TARGET = 1.3


def model_dir(spec: str) -> Path:
    """The model's directory as ``from_pretrained`` reads it: a built-in GGUF model's float
    conversion in attngeom's cache (made once), else the directory given."""
    from attngeom.extract.loading import models

    directory, gguf = models.resolve(spec)
    if gguf is None:
        return Path(directory)
    import torch

    return Path(models._gguf_cached(Path(directory), gguf, torch.float32, False)[2])


def base_child(a) -> None:
    """The plain script: torch and transformers, the base model's forward over the text."""
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    tok = AutoTokenizer.from_pretrained(a.dir)
    text = json.loads(Path(a.data).read_text().splitlines()[0])["text"]
    ids = tok(text, return_tensors="pt", truncation=True, max_length=a.length)["input_ids"]
    t = time.perf_counter()
    with torch.inference_mode():
        model.model(input_ids=ids, use_cache=False)
    print(json.dumps({"tokens": ids.shape[1], "forward_s": time.perf_counter() - t,
                      "total_s": time.perf_counter() - t0}), flush=True)


def command(a, data: Path, out: Path) -> dict:
    argv = [str(Path(sys.executable).with_name("attngeom")), "extract", "--model", a.model,
            "--data", str(data), "--max-length", str(a.length), "--batch-size", "1",
            "--no-text", "--quiet", "--out", str(out)]
    got = run_child_rss(argv, env=child_env(a.threads))
    if got["rc"]:
        raise SystemExit("attngeom extract failed: " + got["stderr"][-800:])
    from attngeom.store import open as open_store

    ds = open_store(out, derived=False)
    tokens = int((ds["token_id"].values >= 0).sum())
    ds.close()
    return {"command_peak_mib": got["peak_rss_mib"], "command_s": got["wall_s"],
            "store_bytes": sum(f.stat().st_size for f in (out / "shards").iterdir()),
            "command_tokens": tokens}


def base(a, data: Path, directory: Path) -> dict:
    got = run_child_rss([sys.executable, __file__, "--child", "--dir", str(directory),
                         "--data", str(data), "--length", str(a.length)],
                        env=child_env(a.threads))
    if got["rc"]:
        raise SystemExit("the plain forward failed: " + got["stderr"][-800:])
    printed = json_lines(got["stdout"])[-1]
    return {"base_peak_mib": got["peak_rss_mib"], "base_s": got["wall_s"],
            "base_forward_s": printed["forward_s"], "base_tokens": printed["tokens"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--length", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        base_child(a)
        return 0
    from bench_length import texts_file

    tmp = Path(tempfile.mkdtemp(prefix="attngeom-bench-peak-"))
    try:
        data, directory = texts_file(tmp, a.model, a.length, False), model_dir(a.model)
        rows = []
        for r in range(a.rounds):
            out = tmp / f"store{r}"
            steps = [lambda: command(a, data, out), lambda: base(a, data, directory)]
            got: dict = {}
            for step in steps if r % 2 == 0 else steps[::-1]:
                got.update(step())
            shutil.rmtree(out, ignore_errors=True)
            if got["command_tokens"] != got["base_tokens"]:
                raise SystemExit(f"the command measured {got['command_tokens']} tokens, the "
                                 f"plain forward {got['base_tokens']}: not the same text")
            got["ratio_peak"] = got["command_peak_mib"] / got["base_peak_mib"]
            got["ratio_s"] = got["command_s"] / got["base_s"]
            rows.append(got)
            log(f"round {r + 1}/{a.rounds}: command {got['command_peak_mib']:.0f} MiB, "
                f"plain forward {got['base_peak_mib']:.0f} MiB -> {got['ratio_peak']:.2f}x")
        spread = {k: [min(x[k] for x in rows), median(x[k] for x in rows),
                      max(x[k] for x in rows)] for k in rows[0]}
        emit({"bench": "peak", "model": a.model, "length": a.length, "rounds": rows,
              "min_median_max": spread, "target": f"peak ratio <= {TARGET} in every round",
              "met": spread["ratio_peak"][2] <= TARGET, "machine": machine()})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
