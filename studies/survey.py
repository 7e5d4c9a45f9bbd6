"""One study of a trained model: geometry, faithfulness, multiple choice, report, CSVs.

Run from the repository root (``studies/<model>/run_survey.sh`` does), after ``make setup``::

    .venv/bin/python studies/survey.py --model smollm2-135m [--data-dir ../shared/data] ...

Steps (each skipped when its output already exists, so a rerun resumes):
1. prepare the inputs into WORK/data (WikiText chunks; round-robin samples of the MC files);
2. ``attngeom extract`` (compact store) and ``attngeom analyze`` on each geometry data set;
3. decoders: ``attngeom faithfulness`` on textbook prose (head granularity, signed and magnitude
   ranking, semantic drift); clean multiple-choice accuracy on MMLU / WinoGrande / BoolQ, with the
   intervention sweep only where it is above chance and above the majority-answer rate (exact
   binomial test, Clopper-Pearson CI);
   the same LM run on GSM8K; optionally one prose run at query granularity (it separates
   value_weighted from value_weighted_normalized);
4. ``attngeom report`` of the first geometry store (faithfulness shown: the prose run), then
   the GSM8K run and the optional query-granularity run;
5. CSVs and the PDF into RESULTS, with ``timings.csv`` and ``data.csv`` (after every step).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export  # noqa: E402
import prepare  # noqa: E402

ENCODERS = {"minilm-l6"}
MC_CHANCE = {"mmlu": 0.25, "winogrande": 0.5, "boolq": 0.5}
METRICS = "attention,value_weighted,value_weighted_normalized,contribution"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data-dir", default="../shared/data", help="default folder of every data file")
    p.add_argument("--wikitext", help="geometry texts (default DATA_DIR/wikitext2_raw_test.jsonl)")
    p.add_argument("--boolq", help="BoolQ records (default DATA_DIR/boolq_validation.jsonl)")
    p.add_argument("--gsm8k", help="GSM8K records (default DATA_DIR/gsm8k_test.jsonl)")
    p.add_argument("--prose", help="prose records (default DATA_DIR/openstax_psychology2e.jsonl)")
    p.add_argument("--mmlu", help="MMLU test records (default DATA_DIR/mmlu_test.jsonl)")
    p.add_argument("--mmlu-dev", help="MMLU exemplars (default DATA_DIR/mmlu_dev.jsonl)")
    p.add_argument("--winogrande", help="WinoGrande records (default DATA_DIR/winogrande_dev.jsonl)")
    p.add_argument("--work", help="scratch folder for stores (default studies/MODEL/work)")
    p.add_argument("--results", help="committed outputs (default studies/MODEL/results)")
    p.add_argument("--geo-limit", type=int, default=72)
    p.add_argument("--geo-max-length", type=int, default=256)
    p.add_argument("--chunk-chars", type=int, default=1400, help="WikiText chunk size (characters)")
    p.add_argument("--geo-boolq", action="store_true", help="also geometry on BoolQ passages")
    p.add_argument("--faith-limit", type=int, default=24, help="prose texts (0: skip)")
    p.add_argument("--gsm8k-limit", type=int, default=None,
                   help="GSM8K texts (default: --faith-limit; 0 skips the GSM8K run)")
    p.add_argument("--faith-max-length", type=int, default=128)
    p.add_argument("--fractions", default="0.1,0.3")
    p.add_argument("--query-limit", type=int, default=0,
                   help="prose texts for an extra query-granularity run (0: skip)")
    p.add_argument("--mc-limit", type=int, default=100,
                   help="items for the clean MC accuracy (0: skip)")
    p.add_argument("--mc-sweep-limit", type=int, default=48, help="items for an MC sweep")
    p.add_argument("--mc-max-length", type=int, default=384)
    p.add_argument("--k-shot", type=int, default=1)
    p.add_argument("--bootstrap", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    d = Path(args.data_dir)
    for key, name in (("wikitext", "wikitext2_raw_test"), ("boolq", "boolq_validation"),
                      ("gsm8k", "gsm8k_test"), ("prose", "openstax_psychology2e"),
                      ("mmlu", "mmlu_test"), ("mmlu_dev", "mmlu_dev"),
                      ("winogrande", "winogrande_dev")):
        if getattr(args, key) is None:
            setattr(args, key, str(d / f"{name}.jsonl"))
    here = Path(__file__).resolve().parent / args.model
    args.work = Path(args.work or here / "work_survey")
    args.results = Path(args.results or here / "results_survey")
    return args


class Study:
    """Runs the attngeom CLI steps and records their wall-clock time."""

    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.cli = str(Path(sys.executable).with_name("attngeom"))
        self.timings: list[dict] = []
        self.sizes: list[dict] = []
        self.env = dict(os.environ, **{v: str(args.threads) for v in
                                       ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})

    def sh(self, step: str, *cmd: str) -> None:
        """The CLI step, with its CPU seconds (children's rusage) next to its wall seconds."""
        t0, before = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"[study] {step}: attngeom {' '.join(cmd)}", flush=True)
        subprocess.run([self.cli, *cmd], check=True, env=self.env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.timings.append(dict(step=step, seconds=round(time.time() - t0, 1), cpu_seconds=round(
            after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1)))
        self.write_logs()

    @staticmethod
    def missing(step: str, data: str) -> bool:
        """True (with a note) when a local data file is absent: that step is skipped."""
        if not str(data).startswith("hf:") and not Path(data).exists():
            print(f"[study] {step}: skipped, no data file {data}", flush=True)
            return True
        return False

    def skip(self, step: str, done: Path) -> bool:
        if done.exists():
            print(f"[study] {step}: already done ({done})", flush=True)
            return True
        return False

    # ------------------------------------------------------------------------- geometry
    def geometry(self, tag: str, data: Path, text_field: str | None,
                 max_length: int | None = None, limit: int | None = None) -> Path:
        """Extract and analyse ``data`` into WORK/store_TAG (default sizes: ``--geo-*``)."""
        store, a = self.a.work / f"store_{tag}", self.a
        manifest = store / "manifest.json"
        done = manifest.exists() and json.loads(manifest.read_text()).get("complete")
        if not done:
            cmd = ["extract", "--model", a.model, "--data", str(data), "--out", str(store),
                   "--max-length", str(max_length or a.geo_max_length),
                   "--limit", str(limit or a.geo_limit), "--quiet"]
            self.sh(f"extract_{tag}", *cmd + (["--text-field", text_field] if text_field else []))
        if not self.skip(f"analyze_{tag}", store / "analysis" / "summary.csv"):
            self.sh(f"analyze_{tag}", "analyze", str(store), "--out", str(store / "analysis"),
                    "--bootstrap", str(a.bootstrap), "--no-progress")
        export.export_analysis(store / "analysis", a.results, f"geo_{tag}")
        return store

    # ----------------------------------------------------------------------- faithfulness
    def faithfulness(self, store: Path, name: str, data: str, limit: int, *extra: str) -> Path:
        nc = store / f"{name}.nc"
        if not self.skip(name, nc):
            self.sh(name, "faithfulness", "--model", self.a.model, "--data", data, "--out",
                    str(store), "--name", name, "--limit", str(limit), "--quiet", *extra)
        return nc

    def lm_run(self, store: Path, name: str, data: str, limit: int, *extra: str) -> None:
        """One language-modelling faithfulness run (head granularity unless ``extra`` says)."""
        a = self.a
        if self.missing(name, data):
            return
        nc = self.faithfulness(store, name, data, limit, "--task", "lm", "--metrics", METRICS,
                               "--ranks", "signed,magnitude", "--fractions", a.fractions,
                               "--max-length", str(a.faith_max_length), *extra)
        prefix = "faith_prose" if name == "faithfulness" else name
        export.export_faithfulness(nc, a.results, prefix)
        self.sizes.append(dict(use=prefix, data=data, n=limit, max_length=a.faith_max_length))

    def mc_runs(self, store: Path) -> None:
        a, rows = self.a, []
        files = {"mmlu": (a.mmlu, "subject"), "winogrande": (a.winogrande, None),
                 "boolq": (a.boolq, None)}
        for task, (src, group) in files.items():
            if self.missing(task, src):
                continue
            sample = a.work / "data" / f"{task}_sample.jsonl"
            n = prepare.task_items(src, sample, a.mc_limit, group)
            extra = ["--task", task, "--max-length", str(a.mc_max_length)]
            if task == "mmlu" and Path(a.mmlu_dev).exists():
                extra += ["--dev", a.mmlu_dev, "--k-shot", str(a.k_shot)]
            elif task == "mmlu":
                extra += ["--k-shot", "0"]
            nc = self.faithfulness(store, f"mc_{task}_clean", str(sample), n, *extra,
                                   "--metrics", "attention", "--modes", "comprehensiveness",
                                   "--ranks", "signed", "--fractions", "0", "--no-drift")
            row = dict(task=task, data=src, **export.clean_accuracy(nc, MC_CHANCE[task]))
            rows.append(row)
            self.sizes.append(dict(use=f"mc_{task}_clean", data=src, n=n,
                                   max_length=a.mc_max_length))
            if row["above_chance"] and a.mc_sweep_limit:
                nc = self.faithfulness(store, f"mc_{task}", str(sample), a.mc_sweep_limit, *extra,
                                       "--metrics", METRICS, "--ranks", "signed,magnitude",
                                       "--fractions", a.fractions)
                export.export_faithfulness(nc, a.results, f"mc_{task}")
                self.sizes.append(dict(use=f"mc_{task}", data=src, n=a.mc_sweep_limit,
                                       max_length=a.mc_max_length))
        if rows:
            pd.DataFrame(rows).to_csv(a.results / "mc_clean.csv", index=False)

    # ------------------------------------------------------------------------------ main
    def run(self) -> None:
        a = self.a
        a.results.mkdir(parents=True, exist_ok=True)
        wiki = a.work / "data" / "wikitext_chunks.jsonl"
        n = prepare.geometry_texts(a.wikitext, wiki, a.geo_limit, a.chunk_chars)
        self.sizes.append(dict(use="geo_wikitext", data=a.wikitext, n=n, max_length=a.geo_max_length))
        store = self.geometry("wikitext", wiki, "text")
        if a.geo_boolq and not self.missing("geo_boolq", a.boolq):
            self.geometry("boolq", Path(a.boolq), "passage")
            self.sizes.append(dict(use="geo_boolq", data=a.boolq, n=a.geo_limit,
                                   max_length=a.geo_max_length))
        if a.model not in ENCODERS:  # in order of priority: the cheapest evidence first
            if a.faith_limit:
                self.lm_run(store, "faithfulness", a.prose, a.faith_limit)
            if a.mc_limit:
                self.mc_runs(store)
        self.report(store)
        if a.model not in ENCODERS:
            gsm8k_limit = a.faith_limit if a.gsm8k_limit is None else a.gsm8k_limit
            if gsm8k_limit:
                self.lm_run(store, "faith_gsm8k", a.gsm8k, gsm8k_limit)
            if a.query_limit:
                self.lm_run(store, "faith_prose_query", a.prose, a.query_limit,
                            "--granularity", "query", "--no-drift")
        self.write_logs()

    def report(self, store: Path) -> None:
        """The PDF of the geometry store, with the prose faithfulness run."""
        pdf = self.a.work / "report.pdf"
        if not self.skip("report", pdf):
            self.sh("report", "report", str(store), "--out", str(pdf), "--no-progress")
        shutil.copyfile(pdf, self.a.results.parent / "report.pdf")

    def write_logs(self) -> None:
        """timings.csv and data.csv: this run's rows replace earlier rows of the same step/use
        (extra columns of a timing row, e.g. CPU seconds, are kept)."""
        for name, key, rows in (("timings", "step", self.timings), ("data", "use", self.sizes)):
            path = self.a.results / f"{name}.csv"
            new = pd.DataFrame(rows, columns=None if rows else [key])
            if path.exists():
                old = pd.read_csv(path)
                kept = [df for df in (old[~old[key].isin(new[key])], new) if len(df)]
                new = pd.concat(kept) if kept else old
            new.to_csv(path, index=False)


if __name__ == "__main__":
    Study(parse()).run()
