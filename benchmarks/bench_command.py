"""The whole ``attngeom extract`` command against the plain scripts a user would run instead.

Issue 46's case (issue 17's before it): a random-init SmolLM2-135M-shaped Llama saved as a
directory (with the SmolLM2 tokenizer), 16 WikiText-2 articles
(``../shared/data/wikitext2_raw_test.jsonl``) cut to 512 tokens, fp32, batches of 2. One JSON
object per line on stdout, progress on stderr.

Sections (``--sections``, default both):

``rounds``   at each thread count of ``--threads`` (default ``0,1``; 0: torch's default),
             ``--repeats`` rounds (default 5) of three fresh processes, their order rotated
             every round (each runs first, second and third in turn): (a) the command as a
             user runs it, ``python -m attngeom extract --model DIR --data FILE ...``
             (imports, load, tokenize, measure, compress, write: everything); (b) and (c)
             ``benchmarks/plain_script.py --attn sdpa`` and ``--attn eager``: the standalone
             script a researcher writes (torch and transformers only: load the model with
             that attention, tokenize the same texts as the command, run the same batches
             with full logits, under ``inference_mode``). Per round: each process's wall and
             CPU seconds and peak resident set, the plain scripts' own forward seconds, and
             the ratios command / sdpa process (target <= 1.25) and command / eager process
             (target <= 1.10), wall and CPU; then the medians and [min, max]. The command's
             store is checked once per run to hold the very token ids the plain scripts ran
             (their printed hash, compared every round): the run stops otherwise.
``startup``  1 text of 8 tokens: the command in a fresh subprocess with a timer around each
             phase (imports; transformers' modeling modules, which the first model load
             would import; load model: config / weights / tokenizer / discovery /
             fingerprint, load texts, store creation, first batch measured, write), and the
             bare ``import torch, transformers`` in another.

``eager_forward`` (the plain eager forward in this process) is what
``bench_faithfulness_command.py`` times against.

    python benchmarks/bench_command.py                  # ~15 min on 2 cores (2 x 5 rounds)
    python benchmarks/bench_command.py --sections rounds --threads 0 --repeats 5
    python benchmarks/bench_command.py --sections rounds --limit 2 --max-length 64 --repeats 1
    python benchmarks/bench_command.py --sections startup
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (SMOLLM2, WIKITEXT, emit, json_lines, log, machine,  # noqa: E402
                     run_child_rss, time_phases)

DATA = WIKITEXT                                 # the texts of the command and the scripts
SECTIONS = ("rounds", "startup")


def model_dir(cache: Path) -> Path:
    """The random-init SmolLM2-shaped model saved as a directory (built once into ``cache``)."""
    where = cache / "smollm2-shaped-random"
    if (where / "config.json").is_file():
        return where
    from _common import random_llama
    from transformers import AutoTokenizer

    from attngeom.extract.loading.models import cache_dir
    found = sorted((cache_dir() / "models").glob("SmolLM2-135M-Instruct*/tokenizer.json"))
    if not found:
        raise SystemExit("no cached SmolLM2 tokenizer: run `attngeom extract --model "
                         "smollm2-135m --data builtin --limit 1 --out /tmp/x` once")
    tmp = where.with_name(where.name + f".tmp-{os.getpid()}")
    random_llama(SMOLLM2).save_pretrained(tmp)
    AutoTokenizer.from_pretrained(found[0].parent).save_pretrained(tmp)
    os.replace(tmp, where)
    return where


def command_args(model: Path, limit: int, max_length: int, out: Path,
                 batch_size: int = 4) -> list[str]:
    return ["extract", "--model", str(model), "--data", str(DATA), "--limit", str(limit),
            "--max-length", str(max_length), "--batch-size", str(batch_size), "--quiet",
            "--out", str(out)]


def child_env(threads: int) -> dict:
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


# ------------------------------------------------------------------------------------ rounds
def eager_forward(model_path: Path, limit: int, max_length: int, batch_size: int = 4):
    """A zero-argument callable: the plain eager forward (full logits) over the command's
    tokens, in the command's batches."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attngeom.extract.loading.data import batches, load_texts, pad_token_id, tokenize_texts
    from attngeom.common import vocab as V

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(model_path)
    texts = load_texts(str(DATA), limit=limit)
    tokenized = tokenize_texts(tok, texts.texts, max_length)
    pad = pad_token_id(tok)

    def run():
        with torch.inference_mode():
            for b in batches(tokenized, batch_size, pad_id=pad):
                model(input_ids=torch.as_tensor(b["input_ids"]),
                      attention_mask=torch.as_tensor(b["attention_mask"]), use_cache=False)
    return run, sum(len(x) for x in tokenized.ids)


LEGS = ("command", "sdpa", "eager")          # the command, plain_script.py --attn sdpa / eager
PLAIN = Path(__file__).resolve().with_name("plain_script.py")


def plain_args(model: Path, limit: int, max_length: int, batch_size: int, attn: str) -> list[str]:
    """``benchmarks/plain_script.py`` over the command's texts, as a fresh process."""
    return [sys.executable, str(PLAIN), "--model", str(model), "--data", str(DATA), "--limit",
            str(limit), "--max-length", str(max_length), "--batch-size", str(batch_size),
            "--attn", attn]


def ids_sha256(ids: list[list[int]]) -> str:
    """The hash plain_script.py prints of its token ids (each text's own, a JSON list)."""
    import hashlib

    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def store_ids(store: Path) -> list[list[int]]:
    """Each sequence's token ids as the store holds them (``token_id`` >= 0)."""
    from attngeom.store import open as open_store

    ds = open_store(store, derived=False)
    try:
        return [[int(t) for t in row if t >= 0] for row in ds["token_id"].values]
    finally:
        ds.close()


def round_order(r: int) -> list[str]:
    """Round ``r``'s order of the three processes: rotated each round, so that each runs first,
    second and third in turn."""
    k = r % len(LEGS)
    return list(LEGS[k:] + LEGS[:k])


def round_ratios(got: dict) -> dict:
    """One round's ratios: the command's process over each plain script's process (wall and
    CPU seconds), and over the forward passes alone as the eager script times them."""
    return {"ratio_command_to_sdpa_process": got["command_s"] / got["sdpa_s"],
            "ratio_command_to_eager_process": got["command_s"] / got["eager_s"],
            "ratio_command_to_sdpa_process_cpu": got["command_cpu_s"] / got["sdpa_cpu_s"],
            "ratio_command_to_eager_process_cpu": got["command_cpu_s"] / got["eager_cpu_s"],
            "ratio_command_to_eager_forward": got["command_s"] / got["eager_forward_s"]}


def summarize_rounds(rows: list[dict]) -> tuple[dict, dict]:
    """The median of every figure over the rounds, and [min, max] of every ratio."""
    summary = {k: median(row[k] for row in rows) for k in rows[0]}
    spread = {k: [min(row[k] for row in rows), max(row[k] for row in rows)]
              for k in rows[0] if k.startswith("ratio")}
    return summary, spread


def run_leg(leg: str, args, model: Path, out: Path, threads: int) -> dict:
    """One fresh process of ``leg``: its wall and CPU seconds and peak resident set (and, for
    the plain scripts, what they print: their forward seconds, load seconds, token ids' hash)."""
    if leg == "command":
        argv = [sys.executable, "-m", "attngeom", *command_args(
            model, args.limit, args.max_length, out, args.batch_size)]
    else:
        argv = plain_args(model, args.limit, args.max_length, args.batch_size, leg)
    res = run_child_rss(argv, env=child_env(threads))
    if res["rc"] != 0:
        raise SystemExit(f"{leg} failed (exit {res['rc']}): " + res["stderr"][-800:])
    got = {f"{leg}_s": res["wall_s"], f"{leg}_cpu_s": res["cpu_s"],
           f"{leg}_peak_rss_mib": res["peak_rss_mib"]}
    if leg != "command":
        printed = json_lines(res["stdout"])[-1]
        got.update({f"{leg}_forward_s": printed["seconds"], f"{leg}_load_s": printed["load_s"],
                    f"{leg}_ids_sha256": printed["ids_sha256"], "tokens": printed["tokens"]})
    return got


def section_rounds(args, model: Path, tmp: Path) -> None:
    """The interleaved rounds at each thread count of ``--threads`` (0: torch's default)."""
    checked: list[str] = []                       # the store's token ids' hash, once checked
    for threads in args.threads:
        _rounds(args, model, tmp, threads, checked)


def _rounds(args, model: Path, tmp: Path, threads: int, checked: list[str]) -> None:
    rows = []
    for r in range(args.repeats):
        got: dict = {"load_avg_1m": os.getloadavg()[0]}      # before the round: quiet?
        out = tmp / f"command-{threads}-{r}"
        for leg in round_order(r):
            got.update(run_leg(leg, args, model, out, threads))
        if not checked:                           # once per run: the same tokens in all three
            stored = ids_sha256(store_ids(out))
            checked.append(stored)
            log(f"the command's store holds the plain scripts' tokens: {stored[:12]}")
        shutil.rmtree(out, ignore_errors=True)
        hashes = {leg: got.pop(f"{leg}_ids_sha256") for leg in LEGS[1:]}
        wrong = {leg: h for leg, h in hashes.items() if h != checked[0]}
        if wrong:
            raise SystemExit(f"the token ids differ: the command's store {checked[0][:12]}, "
                             + ", ".join(f"plain_script.py --attn {leg} {h[:12]}"
                                         for leg, h in wrong.items())
                             + "; the comparison is void (fix plain_script.py's tokenization)")
        tokens = got.pop("tokens")
        got.update(round_ratios(got))
        rows.append(got)
        log(f"threads {threads or 'default'}, round {r + 1}/{args.repeats} "
            f"({', '.join(round_order(r))}): command {got['command_s']:.1f}s, sdpa "
            f"{got['sdpa_s']:.1f}s, eager {got['eager_s']:.1f}s -> "
            f"{got['ratio_command_to_sdpa_process']:.2f}x / "
            f"{got['ratio_command_to_eager_process']:.2f}x")
    summary, spread = summarize_rounds(rows)
    emit({"bench": "command", "section": "rounds", "case": f"threads_{threads or 'default'}",
          "texts": args.limit, "max_length": args.max_length, "batch_size": args.batch_size,
          "tokens": tokens, "threads_option": threads or "default",
          "median": summary, "spread": spread,
          "target": "command <= 1.25 x the sdpa script's process, <= 1.10 x the eager one's",
          "met": {"sdpa": summary["ratio_command_to_sdpa_process"] <= 1.25,
                  "eager": summary["ratio_command_to_eager_process"] <= 1.10},
          "rounds": rows, "machine": machine()})


# ------------------------------------------------------------------------------------ startup
# (module, attribute, label): wrapped with a timer in the startup child
PHASES = [
    ("attngeom.commands.extract", "load_data", "load texts"),
    ("attngeom.extract.loading.models", "load", "load model (all)"),
    ("attngeom.extract.loading.models", "_load_hf", "  config + weights"),
    ("attngeom.extract.loading.models", "_processor", "  tokenizer"),
    ("attngeom.extract.measurement.archs", "_discover", "  discovery probe pass"),
    ("attngeom.extract.loading.models", "weight_fingerprint", "  weight fingerprint"),
    ("attngeom.extract.run", "versions", "versions"),
    ("attngeom.store.io.writer.StoreWriter", "create", "store creation"),
    ("attngeom.extract.run", "measure_rows", "measure (all batches)"),
    ("attngeom.store.io.writer.StoreWriter", "add_shard", "write shard"),
    ("attngeom.store.io.writer.StoreWriter", "finish", "finish store"),
    ("attngeom.store.ops.info", "summary", "summary"),
]


def _child_startup(args) -> None:
    """Internal: the command in this fresh process, each phase timed from the process start."""
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401
    t_torch = time.perf_counter() - t0
    from attngeom.cli import main
    import attngeom.extract.run  # noqa: F401
    import attngeom.extract.measurement.archs  # noqa: F401
    t_import = time.perf_counter() - t0
    # transformers' own modules that the first model load imports (modeling_utils pulls in
    # torch._dynamo, torch.distributed.tensor, the loss zoo; then the model's modeling file):
    # imports, timed on their own, that a plain script loading the model pays too
    from transformers import AutoConfig, AutoModelForCausalLM
    import transformers.modeling_utils  # noqa: F401
    AutoModelForCausalLM._model_mapping[type(AutoConfig.from_pretrained(args.model))]
    t_modeling = time.perf_counter() - t0
    spent, first = time_phases(PHASES, t0)
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(command_args(Path(args.model), 1, 8, Path(args.child_out)))
    done = first.get("measure (all batches)")
    print(json.dumps({"rc": rc, "import_torch_transformers_s": t_torch, "import_s": t_import,
                      "import_with_modeling_s": t_modeling,
                      "total_s": time.perf_counter() - t0, "phases_s": spent,
                      "first_batch_done_at_s": done,
                      "first_batch_after_all_imports_s": None if done is None else
                      done - t_modeling, "ends_at_s": first}), flush=True)


def section_startup(args, model: Path, tmp: Path) -> None:
    env = child_env(args.threads[0])
    bare = run_child_rss([sys.executable, "-c", "import torch, transformers"], env=env)
    cmd = run_child_rss([sys.executable, "-m", "attngeom", *command_args(model, 1, 8,
                         tmp / "startup-cmd")], env=env)
    res = run_child_rss([sys.executable, __file__, "--child", "startup", "--model", str(model),
                         "--child-out", str(tmp / "startup")], env=env)
    rec = (json_lines(res["stdout"]) or [{"error": res["stderr"][-800:]}])[-1]
    emit({"bench": "command", "section": "startup", "texts": 1, "max_length": 8,
          "import_torch_transformers_process_s": bare["wall_s"],
          "command_process_s": cmd["wall_s"], "command_rc": cmd["rc"],
          "timed_process_s": res["wall_s"], **rec})


# ------------------------------------------------------------------------------------ main
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--threads", type=lambda t: [int(x) for x in t.split(",")], default=[0, 1],
                   help="torch threads, comma-separated, each its own rounds (0: torch's "
                        "default, no OMP_NUM_THREADS), e.g. 0,1")
    p.add_argument("--batch-size", type=int, default=2, help="texts per forward pass (all three)")
    p.add_argument("--cache", default=None, help="where the random model directory is kept "
                   "(default: a folder under the system's temp dir)")
    p.add_argument("--child", choices=["startup"], help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.child == "startup":
        _child_startup(args)
        return 0
    sections = [s for s in args.sections.split(",") if s]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        raise SystemExit(f"unknown section(s) {bad}; choose from {SECTIONS}")
    cache = Path(args.cache or Path(tempfile.gettempdir()) / "attngeom-bench-command")
    cache.mkdir(parents=True, exist_ok=True)
    model = model_dir(cache)
    tmp = Path(tempfile.mkdtemp(prefix="attngeom-bench-"))
    try:
        if "startup" in sections:
            section_startup(args, model, tmp)
        if "rounds" in sections:
            section_rounds(args, model, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
