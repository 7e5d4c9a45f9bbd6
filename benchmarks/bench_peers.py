"""attngeom against the tools a researcher would use instead, side by side (issue 46).

The same numbers on SmolLM2-135M over the same WikiText-2 texts, by each tool as a fresh
process: per layer and head, alpha, the projected value norms, the cosines to the head output
and the contribution weights, for every query and key.

- ``attngeom``: ``attngeom extract --mode dense`` (every pair) and the default ``compact``
  mode, its store written (its time includes writing; the bytes written are recorded);
- the peers of ``benchmarks/peers/`` (``registry.py``), each in its own environment
  (``benchmarks/peers/setup.sh``): a plain transformers + hooks script (output_attentions,
  and ``plain-layer``: measured layer by layer in a hook), TransformerLens, nnsight, and inseq
  (alpha only). ``keep`` holds every result in memory, ``discard`` computes and drops each
  (both where the tool can; inseq's attribution object is what it keeps).

Before any peer is timed, ``peers/check.py`` compares its numbers with attngeom's dense store
(2 texts x 128 tokens by default): a peer that computes something else is not timed.

Cases: ``NxT`` is N texts cut to T tokens (``16x512``: the first 16 WikiText-2 articles); a
single text (``1x2048``, ``1x4096``, ``1x8192``) is one text cut to each length: the first
WikiText-2 article as long as the longest single-text case (article 3, 9,623 tokens, when
8,192 is asked for), else the articles joined until it is (the record says which).
Each cell is a fresh process, timed from start to exit (wall and CPU seconds) with its own
peak resident set (``wait4``), under an address-space limit (``RLIMIT_AS``, ``--limit-gib``,
16 GiB) so that one that runs out of memory fails alone, and a time limit (``--timeout``).
Rounds are interleaved (every tool once per round, the order rotated each round), at the
default thread count and at one thread; one round for texts of 8,192 tokens or more. A tool
that fails a case (out of memory, refused, timed out) is not run again on it nor on a longer
single text: the table says where it stopped.

Every cell appends one JSON line to ``--results`` (default ``runs/bench_peers.jsonl``); a rerun
skips the cells already there, so the benchmark resumes where it stopped. The table (medians
over rounds; ratios to attngeom's compact and dense processes) is printed at the end, or alone
with ``--table``.

    attngeom bench peers                                     # the full matrix
    attngeom bench peers --cases 2x128 --rounds 1 --threads 0 --results runs/smoke.jsonl
    attngeom bench peers --table
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))
from _common import emit, log, machine, run_child_rss  # noqa: E402
from registry import DATA, MODEL, PEERS, REPO, long_text, missing_envs  # noqa: E402
from registry import model_dir, peer_argv, write_texts  # noqa: E402

CASES = ("16x512", "1x2048", "1x4096", "1x8192")
ATTNGEOM = (("attngeom", "compact"), ("attngeom", "dense"))
GiB = 1 << 30
FAILED = ("out of memory", "refused", "timed out", "failed")


def tools(names: list[str], modes: list[str]) -> list[tuple[str, str]]:
    """(tool, mode) pairs to time: attngeom's two modes, each peer's keep and discard."""
    out = list(ATTNGEOM) if "attngeom" in names else []
    for name in names:
        if name in PEERS:
            out += [(name, m) for m in PEERS[name].modes if m in modes]
    return out


def parse_case(case: str) -> tuple[int, int]:
    n, t = case.lower().split("x")
    return int(n), int(t)


def key(rec: dict) -> tuple:
    return (rec["case"], rec["tool"], rec["mode"], rec["threads"], rec["round"],
            rec["batch_size"])


def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append(path: Path, rec: dict) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
    return emit(rec)


# ---------------------------------------------------------------------------------- one cell
def status_of(got: dict) -> str:
    """ok, out of memory, refused (attngeom's up-front estimate), timed out or failed."""
    err = got["stderr"]
    if got["rc"] == 0:
        return "ok"
    if got.get("timed_out"):
        return "timed out"
    if "needs about" in err and "memory" in err:
        return "refused"
    if any(s in err for s in ("MemoryError", "can't allocate memory", "out of memory",
                              "std::bad_alloc", "Cannot allocate memory")) or got["rc"] == -9:
        return "out of memory"
    return "failed"


def child_env(threads: int) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def run_cell(tool: str, mode: str, data: Path, limit: int, T: int, threads: int, a,
             model: Path, work: Path) -> dict:
    """One process of one tool on one case: its record (seconds, peak, status, ...)."""
    out = None
    if tool == "attngeom":
        out = Path(tempfile.mkdtemp(dir=work)) / "store"
        argv = [str(Path(sys.executable).with_name("attngeom")), "extract", "--model", MODEL,
                "--data", str(data), "--limit", str(limit), "--max-length", str(T),
                "--batch-size", str(a.batch_size), "--mode", mode, "--quiet", "--no-text",
                "--out", str(out)] + (["--threads", str(threads)] if threads else [])
    else:
        argv = peer_argv(tool, model, data, limit, T, a.batch_size, threads, mode)
    got = run_child_rss(argv, env=child_env(threads), as_limit_bytes=int(a.limit_gib * GiB),
                        timeout_s=a.timeout)
    rec = {"status": status_of(got), "rc": got["rc"], "wall_s": got["wall_s"],
           "cpu_s": got["cpu_s"], "peak_rss_mib": got["peak_rss_mib"]}
    if rec["status"] != "ok":
        rec["error"] = (got["stderr"].strip().splitlines() or ["?"])[-1][-300:]
    inner = [json.loads(x) for x in got["stdout"].splitlines() if x.startswith('{"peer"')]
    if inner:
        rec.update({k: inner[-1][k] for k in ("load_s", "measure_s", "held_bytes", "tokens")})
    if out is not None:
        rec["store_bytes"] = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        shutil.rmtree(out.parent, ignore_errors=True)
    return rec


# ---------------------------------------------------------------------------------- the gate
def gate(a, peers: list[str], results: Path) -> list[str]:
    """The peers whose numbers match attngeom's dense store (checked once, recorded)."""
    import check

    size = {"texts": a.check_limit, "max_length": a.check_length}
    done = {r["peer"]: r for r in load(results) if r.get("kind") == "check"
            and all(r.get(k) == v for k, v in size.items())}
    todo = [p for p in peers if p not in done]
    if todo:
        log(f"checking {', '.join(todo)} against attngeom's dense store")
        with tempfile.TemporaryDirectory() as tmp:
            for rec in check.run(todo, a.check_limit, a.check_length, 2, Path(tmp)):
                done[rec["peer"]] = append(results, {"kind": "check", **rec})
    for p in peers:
        print(f"# check: {check.describe(done[p])}", file=sys.stderr, flush=True)
    return [p for p in peers if done[p]["passed"]]


# ---------------------------------------------------------------------------------- the matrix
def case_data(case: str, tokenizer, work: Path, longest: int) -> tuple[Path, int, int, str]:
    """The texts file, number of texts, length, and what the texts are. Every single-text
    case cuts the same text: the first one of at least ``longest`` tokens."""
    n, T = parse_case(case)
    if n > 1:
        return DATA, n, T, f"the first {n} WikiText-2 articles"
    text, what = long_text(tokenizer, longest)
    return write_texts(work / f"{case}.jsonl", [text]), 1, T, what


def stopped(records: list[dict], tool: str, mode: str, threads: int, case: str,
            r: int) -> str | None:
    """Why a cell is not run: the tool failed this case in an earlier round, or a shorter
    single text (None: run it)."""
    n, T = parse_case(case)
    for rec in records:
        if (rec.get("kind") == "cell" and (rec["tool"], rec["mode"], rec["threads"])
                == (tool, mode, threads) and rec["status"] in FAILED):
            m, t = parse_case(rec["case"])
            if (rec["case"] == case and rec["round"] < r) or (n == m == 1 and t < T):
                return f"{rec['status']} at {rec['case']}"
    return None


def run_matrix(a, results: Path) -> None:
    from transformers import AutoTokenizer

    model = model_dir()
    names = a.tools.split(",")
    peers = [p for p in names if p in PEERS]
    if missing_envs(peers):
        sys.exit(f"no environment for {', '.join(missing_envs(peers))}: run "
                 "benchmarks/peers/setup.sh")
    if peers and not a.no_check:
        passed = gate(a, peers, results)
        names = [n for n in names if n not in PEERS or n in passed]
    todo = tools(names, a.modes.split(","))
    tokenizer = AutoTokenizer.from_pretrained(model)
    append(results, {"kind": "machine", "date": _now(), **machine(),
                     "limit_gib": a.limit_gib, "batch_size": a.batch_size})
    work = results.parent / (results.stem + "_work")
    work.mkdir(parents=True, exist_ok=True)
    cases = a.cases.split(",")
    longest = max([parse_case(c)[1] for c in cases if parse_case(c)[0] == 1], default=0)
    for case in cases:
        data, limit, T, what = case_data(case, tokenizer, work, longest)
        for r in range(1 if T >= 8192 else a.rounds):
            for threads in map(int, a.threads.split(",")):
                order = todo[r % len(todo):] + todo[:r % len(todo)]
                for tool, mode in order:
                    base = {"kind": "cell", "case": case, "texts": what, "tool": tool,
                            "mode": mode, "threads": threads, "round": r,
                            "batch_size": a.batch_size}
                    records = load(results)
                    if key(base) in {key(x) for x in records if x.get("kind") == "cell"}:
                        continue
                    why = stopped(records, tool, mode, threads, case, r)
                    if why:
                        append(results, {**base, "status": "skipped", "error": why})
                        continue
                    log(f"{case} round {r + 1} threads {threads or 'default'}: {tool} {mode}")
                    rec = run_cell(tool, mode, data, limit, T, threads, a, model, work)
                    append(results, {**base, **rec, "date": _now(),
                                     "load_avg_1m": os.getloadavg()[0]})


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------- the table
def summary(records: list[dict]) -> dict[tuple, dict]:
    """Per (case, threads, tool, mode): median seconds and peak MiB over the ok rounds, or the
    status that stopped it."""
    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        if rec.get("kind") == "cell":
            groups.setdefault((rec["case"], rec["threads"], rec["tool"], rec["mode"]),
                              []).append(rec)
    out = {}
    for k, recs in groups.items():
        ok = [r for r in recs if r["status"] == "ok"]
        if ok:
            out[k] = {"wall_s": median(r["wall_s"] for r in ok),
                      "peak_mib": median(r["peak_rss_mib"] for r in ok), "n": len(ok),
                      "held_bytes": ok[0].get("held_bytes"),
                      "store_bytes": ok[0].get("store_bytes")}
        else:
            out[k] = {"status": next((r["status"] for r in recs if r["status"] != "skipped"),
                                     recs[0].get("error", "skipped")),
                      "peak_mib": max(r["peak_rss_mib"] for r in recs if "peak_rss_mib" in r)
                      if any("peak_rss_mib" in r for r in recs) else None}
    return out


def table(records: list[dict]) -> list[str]:
    """Markdown tables, one per (case, threads): each tool's seconds and peak, and its ratios
    to attngeom's compact and dense processes."""
    s = summary(records)
    lines = []
    cases = sorted({k[:2] for k in s}, key=lambda c: (parse_case(c[0])[1], c[0], c[1]))
    for case, threads in cases:
        order = ["attngeom", *PEERS]
        rows = sorted((k for k in s if k[:2] == (case, threads)), key=lambda k: (
            order.index(k[2]) if k[2] in order else len(order), k[2], k[3]))
        base = {m: s.get((case, threads, "attngeom", m)) for m in ("compact", "dense")}
        lines += [f"\n### {case}, {'default threads' if threads == 0 else f'{threads} thread'}"
                  f"{'s' if threads > 1 else ''}\n",
                  "| tool | results | seconds | peak RSS | held / written | x compact "
                  "(time, peak) | x dense (time, peak) | rounds |",
                  "|---|---|---|---|---|---|---|---|"]
        for k in rows:
            v = s[k]
            if "wall_s" not in v:
                peak = f"{v['peak_mib'] / 1024:.1f} GiB at the end" if v["peak_mib"] else ""
                lines.append(f"| {k[2]} | {k[3]} | {v['status']} | {peak} | | | | |")
                continue
            held = v.get("store_bytes") or v.get("held_bytes")
            ratios = [f"{v['wall_s'] / b['wall_s']:.2f}x, {v['peak_mib'] / b['peak_mib']:.2f}x"
                      if b and "wall_s" in b else "" for b in (base["compact"], base["dense"])]
            lines.append(f"| {k[2]} | {k[3]} | {v['wall_s']:.1f} s | "
                         f"{v['peak_mib'] / 1024:.2f} GiB | "
                         f"{f'{held / GiB:.2f} GiB' if held else ''} | {ratios[0]} | "
                         f"{ratios[1]} | {v['n']} |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES), help="NxT: N texts of T tokens")
    p.add_argument("--tools", default="attngeom," + ",".join(PEERS))
    p.add_argument("--modes", default="keep,discard", help="the peers' keep and/or discard")
    p.add_argument("--threads", default="0,1", help="torch threads per process (0: default)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (1 at T >= 8192)")
    p.add_argument("--batch-size", type=int, default=4, help="texts per forward, every tool")
    p.add_argument("--limit-gib", type=float, default=16, help="RLIMIT_AS of every process")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per process")
    p.add_argument("--results", default=str(REPO / "runs" / "bench_peers.jsonl"))
    p.add_argument("--no-check", action="store_true", help="time peers without the check")
    p.add_argument("--check-limit", type=int, default=2)
    p.add_argument("--check-length", type=int, default=128)
    p.add_argument("--table", action="store_true", help="print the table of --results only")
    a = p.parse_args(argv)
    results = Path(a.results)
    if not a.table:
        run_matrix(a, results)
    print("\n".join(table(load(results))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
