"""The whole ``attngeom extract`` command against a plain eager forward; one JSON object per line.

Issue 17's case: a random-init SmolLM2-135M-shaped Llama saved as a directory (with the
SmolLM2 tokenizer), 16 WikiText-2 articles (``../shared/data/wikitext2_raw_test.jsonl``) cut to
512 tokens, fp32, one torch thread.

Sections (``--sections``, default both):

``rounds``   paired rounds, order alternating: (a) the command as a user runs it, a fresh
             ``python -m attngeom extract --model DIR --data FILE ...`` subprocess (imports,
             load, tokenize, measure, write: everything), and (b) in this process, a plain
             eager forward with full logits over the same tokens in the same batches (model
             loaded once, forward only). Also (c) ``attngeom.cli.main`` in this process (the
             same code path, imports already paid). And (d) the plain script as a process: a
             fresh ``python`` that imports torch and transformers, loads the model, tokenizes
             and runs (b)'s forward once: what any fresh process pays before and around the
             forward, the floor of (a)/(b). Per round the ratios (a)/(b), (c)/(b), (d)/(b)
             and (a)/(d); then the medians and spread.
``startup``  1 text of 8 tokens: the command in a fresh subprocess with a timer around each
             phase (imports; transformers' modeling modules, which the first model load
             would import; load model: config / weights / tokenizer / discovery /
             fingerprint, load texts, store creation, first batch measured, write), and the
             bare ``import torch, transformers`` in another.

    python benchmarks/bench_command.py                       # ~6 min on 2 cores
    python benchmarks/bench_command.py --sections rounds --threads 1,0 --batch-size 2
    python benchmarks/bench_command.py --sections startup
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, SMOLLM2, emit, json_lines, log, machine, run_child_rss  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "wikitext2_raw_test.jsonl"
if not DATA.is_file():                          # a worktree: /work/wt/X -> /work/shared
    DATA = REPO.parent.parent / "shared" / "data" / "wikitext2_raw_test.jsonl"
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


def section_rounds(args, model: Path, tmp: Path) -> None:
    """The paired rounds at each thread count of ``--threads`` (0: torch's default)."""
    import torch

    default = torch.get_num_threads()
    for threads in args.threads:
        torch.set_num_threads(threads or default)
        _rounds(args, model, tmp, threads)
    torch.set_num_threads(default)


def _rounds(args, model: Path, tmp: Path, threads: int) -> None:
    import torch

    from attngeom.cli import main as cli_main
    forward, tokens = eager_forward(model, args.limit, args.max_length, args.batch_size)
    forward()                                               # warm-up (allocator, kernels)
    rows = []
    for r in range(args.repeats):
        got: dict[str, float] = {}

        def sub():
            out = tmp / f"sub{r}"
            res = run_child_rss([sys.executable, "-m", "attngeom", *command_args(
                model, args.limit, args.max_length, out, args.batch_size)],
                env=child_env(threads))
            if res["rc"] != 0:
                raise SystemExit("attngeom extract failed: " + res["stderr"][-500:])
            got["command_s"] = res["wall_s"]
            got["command_cpu_s"] = res["cpu_s"]
            shutil.rmtree(out, ignore_errors=True)

        def inproc():
            out = tmp / f"in{r}"
            import contextlib
            import io
            t0, c0 = time.perf_counter(), time.process_time()
            with contextlib.redirect_stdout(io.StringIO()):
                rc = cli_main(command_args(model, args.limit, args.max_length, out,
                                           args.batch_size))
            got["in_process_s"] = time.perf_counter() - t0
            got["in_process_cpu_s"] = time.process_time() - c0
            assert rc == 0, rc
            shutil.rmtree(out, ignore_errors=True)

        def plain():
            res = run_child_rss([sys.executable, __file__, "--child", "plain", "--model",
                                 str(model), "--limit", str(args.limit), "--max-length",
                                 str(args.max_length), "--batch-size", str(args.batch_size)],
                                env=child_env(threads))
            if res["rc"] != 0:
                raise SystemExit("the plain script failed: " + res["stderr"][-500:])
            got["plain_process_s"] = res["wall_s"]

        def eager():
            t0, c0 = time.perf_counter(), time.process_time()
            forward()
            got["eager_s"] = time.perf_counter() - t0
            got["eager_cpu_s"] = time.process_time() - c0

        got["load_avg_1m"] = os.getloadavg()[0]               # before the round: quiet?
        steps = [sub, eager, inproc, plain] if r % 2 == 0 else [plain, eager, inproc, sub]
        if not args.in_process:
            steps.remove(inproc)
        if not args.plain:
            steps.remove(plain)
        for step in steps:
            step()
        got["ratio_command"] = got["command_s"] / got["eager_s"]
        got["ratio_command_cpu"] = got["command_cpu_s"] / got["eager_cpu_s"]
        if args.plain:
            got["ratio_plain_process"] = got["plain_process_s"] / got["eager_s"]
            got["ratio_command_to_plain_process"] = got["command_s"] / got["plain_process_s"]
        if args.in_process:
            got["ratio_in_process"] = got["in_process_s"] / got["eager_s"]
            got["ratio_in_process_cpu"] = got["in_process_cpu_s"] / got["eager_cpu_s"]
        rows.append(got)
        log(f"round {r + 1}/{args.repeats}: command {got['command_s']:.1f}s, in-process "
            f"{got.get('in_process_s', float('nan')):.1f}s, eager {got['eager_s']:.1f}s -> "
            f"{got['ratio_command']:.2f}x / {got.get('ratio_in_process', float('nan')):.2f}x")
    summary = {k: median(row[k] for row in rows) for k in rows[0]}
    spread = {k: [min(row[k] for row in rows), max(row[k] for row in rows)]
              for k in rows[0] if k.startswith("ratio")}
    emit({"bench": "command", "section": "rounds", "texts": args.limit,
          "max_length": args.max_length, "batch_size": args.batch_size, "tokens": tokens,
          "threads": torch.get_num_threads(), "threads_option": threads or "default",
          "median": summary, "spread": spread, "target": "command <= 1.25 x eager forward",
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
    ("attngeom.extract.run", "measure_batches", "measure (all batches)"),
    ("attngeom.store.io.writer.StoreWriter", "add_shard", "write shard"),
    ("attngeom.store.io.writer.StoreWriter", "finish", "finish store"),
    ("attngeom.store.ops.info", "summary", "summary"),
]


def _resolve(path: str):
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


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
    spent: dict[str, float] = {}
    first: dict[str, float] = {}

    def timed(fn, label):
        def wrapper(*a, **kw):
            s = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - s
                first.setdefault(label, time.perf_counter() - t0)
        return wrapper

    for path, attr, label in PHASES:
        owner = _resolve(path)
        raw = owner.__dict__[attr]
        wrapped = timed(raw.__func__ if isinstance(raw, classmethod) else raw, label)
        setattr(owner, attr, classmethod(wrapped) if isinstance(raw, classmethod) else wrapped)
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
    p.add_argument("--no-in-process", dest="in_process", action="store_false",
                   help="skip the in-process attngeom.cli.main leg (shorter rounds)")
    p.add_argument("--no-plain", dest="plain", action="store_false",
                   help="skip the plain script as a fresh process (load + one eager forward)")
    p.add_argument("--threads", type=lambda t: [int(x) for x in t.split(",")], default=[1],
                   help="torch threads, comma-separated, each its own rounds (0: torch's "
                        "default), e.g. 1,0")
    p.add_argument("--batch-size", type=int, default=4, help="texts per forward pass (both)")
    p.add_argument("--cache", default=None, help="where the random model directory is kept "
                   "(default: a folder under the system's temp dir)")
    p.add_argument("--child", choices=["startup", "plain"], help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.child == "startup":
        _child_startup(args)
        return 0
    if args.child == "plain":                  # the plain script: load, tokenize, one forward
        eager_forward(Path(args.model), args.limit, args.max_length, args.batch_size)[0]()
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
