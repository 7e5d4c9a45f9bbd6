"""The marginal cost of a removal pass through ``attngeom faithfulness``, against an eager forward.

Issue 31's case: a random-init SmolLM2-135M-shaped Llama saved as a directory, 8 WikiText-2
articles cut to 128 tokens, one batch of 8, contribution, comprehensiveness, signed, no drift.
Two fresh command processes per round, one with 1 fraction and one with 5: the difference over
4 is what one more removal pass costs a user, loading and writing cancelled out. Against it the
eager forward (full logits) of the same batch in this process. Rounds alternate the order.

    python benchmarks/bench_faithfulness_command.py --threads 0 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, log, machine, run_child_rss  # noqa: E402
from bench_command import DATA, child_env, eager_forward, model_dir  # noqa: E402

FEW, MANY = "0.1", "0.1,0.2,0.3,0.4,0.5"


def command(model: Path, out: Path, fractions: str, limit: int, length: int, batch: int,
            threads: int) -> list[str]:
    argv = [str(Path(sys.executable).with_name("attngeom")), "faithfulness", "--model",
            str(model), "--data", str(DATA), "--out", str(out), "--metrics", "contribution",
            "--modes", "comprehensiveness", "--ranks", "signed", "--fractions", fractions,
            "--max-length", str(length), "--limit", str(limit), "--batch-size", str(batch),
            "--no-drift", "--quiet", "--force"]
    return argv + (["--threads", str(threads)] if threads else [])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--cache", default=None, help="where the random model is kept")
    a = p.parse_args(argv)
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    emit({"bench": "faithfulness_command", "section": "machine", **machine()})
    cache = Path(a.cache or tempfile.gettempdir()) / "attngeom-bench"
    cache.mkdir(parents=True, exist_ok=True)
    model = model_dir(cache)
    eager, _ = eager_forward(model, a.limit, a.max_length, a.batch_size)
    eager()                                                              # warm
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            got = {}
            for which in ((FEW, MANY) if r % 2 == 0 else (MANY, FEW)):
                argv = command(model, Path(tmp) / "out", which, a.limit, a.max_length,
                               a.batch_size, a.threads)
                run = run_child_rss(argv, env=child_env(a.threads))
                if run["rc"]:
                    raise SystemExit(run["stderr"][-2000:])
                got[which] = run["wall_s"]
            t0 = time.perf_counter()
            eager()
            forward = time.perf_counter() - t0
            marginal = (got[MANY] - got[FEW]) / 4
            rounds.append(dict(few_s=got[FEW], many_s=got[MANY], eager_s=forward,
                               marginal_s=marginal, ratio=marginal / forward,
                               load_avg=os.getloadavg()[0]))
            emit({"bench": "faithfulness_command", "round": r, **rounds[-1]})
            log(f"round {r}: one more pass {marginal:.2f} s, eager {forward:.2f} s "
                f"({marginal / forward:.2f}x)")
    ratios = [x["ratio"] for x in rounds]
    emit({"bench": "faithfulness_command", "threads": torch.get_num_threads(),
          "ratio_median": median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
          "marginal_median_s": median(x["marginal_s"] for x in rounds),
          "eager_median_s": median(x["eager_s"] for x in rounds)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
