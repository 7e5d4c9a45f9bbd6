"""The second study (studies/README.md, "Design of the second faithfulness study").

Run from the repository root after ``make setup`` (``studies/<model>/run_faithfulness.sh`` passes
the design's sizes)::

    .venv/bin/python studies/faithfulness_study.py --model smollm2-135m [--data-dir DIR] [--plan]

Steps (``--steps``, default all but ``geometry-prose``; each is skipped when its result exists,
an interrupted faithfulness run resumes from its finished blocks, so rerunning the same command
resumes):

- ``gu``: Gu et al.'s sink-head metric (studies/gu_sinks.py) on natural / random / repeated inputs;
- ``design1-prose``, ``design1-gsm8k``: every layer at once, the fraction grid, both modes and
  ranks, head granularity, no drift pass (``attngeom faithfulness``);
- ``design2``: one run per layer (``--layers L``), the first ``--design2-n`` prose texts,
  comprehensiveness, one fraction, attention / value_weighted / contribution, signed rank;
- ``geometry``: ``attngeom extract`` + ``analyze`` on ``--geo-n`` WikiText-2 chunks;
- ``geometry-prose``: the same on design 1's prose texts, at ``--length`` tokens.

A design-1 variant (``--variant NAME`` with ``--granularity``, ``--metrics``, ``--modes``,
``--ranks``, ``--length``, ``--prose-skip``) keeps its texts, runs and CSVs apart from the base
design's: ``d1_prose_NAME``. At ``--granularity token`` the field's methods rank too; a run
with ``random`` also writes the ranking of every metric (``d1_*_ranking``, ``_vs_random``).

Before any step runs the plan is printed and written to RESULTS/plan.csv: forward passes per
step and the hours they take at the seconds per pass timed here on one batch of the study's own
texts (studies/plan.py; a variant's: RESULTS/plan_NAME.csv). ``--plan`` stops after it.
Texts are selected with the model's tokenizer (studies/texts.py) into WORK/data; faithfulness results go to WORK/faith_*; CSVs, figures,
``plan.csv``, ``timings.csv`` and ``data.csv`` to RESULTS (default
studies/MODEL/results_faithfulness). Separate steps may run in separate processes at the same time
(``--steps``).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export  # noqa: E402
import figures  # noqa: E402
import gu_sinks  # noqa: E402
import plan  # noqa: E402
import prepare  # noqa: E402
import study_plan  # noqa: E402
import survey  # noqa: E402
import texts  # noqa: E402

STEPS = ("gu", "design1-prose", "design1-gsm8k", "design2", "geometry", "geometry-prose")
DEFAULT_STEPS = STEPS[:-1]       # geometry-prose belongs to a variant (e.g. 512-token texts)
DESIGN1 = dict(task="lm", granularity="head", drift=False,
               metrics=("attention", "value_weighted", "value_weighted_normalized",
                        "contribution"),
               modes=("comprehensiveness", "sufficiency"), ranks=("signed", "magnitude"))
DESIGN2 = dict(task="lm", granularity="head", drift=False,
               metrics=("attention", "value_weighted", "contribution"),
               modes=("comprehensiveness",), ranks=("signed",))
# options of a result that must match for a finished step to be reused
MATCH = ("task", "metrics", "modes", "ranks", "fractions", "granularity", "layers",
         "max_length", "limit", "drift")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data-dir", default="../shared/data", help="default folder of the data")
    p.add_argument("--prose", help="OpenStax sections (default DATA_DIR/openstax_psychology2e.jsonl)")
    p.add_argument("--gsm8k", help="GSM8K records (default DATA_DIR/gsm8k_test.jsonl)")
    p.add_argument("--wikitext", help="WikiText-2 articles (default DATA_DIR/wikitext2_raw_test.jsonl)")
    p.add_argument("--work", help="scratch folder (default studies/MODEL/work_faithfulness)")
    p.add_argument("--results",
                   help="CSVs and figures (default studies/MODEL/results_faithfulness)")
    p.add_argument("--steps", default=",".join(DEFAULT_STEPS),
                   help=f"comma-separated: {','.join(STEPS)} (default all but geometry-prose)")
    p.add_argument("--plan", action="store_true", help="print and write the plan, run nothing")
    p.add_argument("--reuse-plan", action="store_true",
                   help="print RESULTS/plan.csv instead of timing again (a resumed run)")
    p.add_argument("--prose-n", type=int, default=160)
    p.add_argument("--gsm8k-n", type=int, default=160)
    p.add_argument("--length", type=int, default=128, help="tokens per text (the cut)")
    p.add_argument("--gsm8k-min", type=int, default=96, help="fewest GSM8K tokens after the cut")
    p.add_argument("--fractions", default="0.01,0.02,0.05,0.1,0.2")
    p.add_argument("--granularity", default="head", choices=("head", "query", "token"),
                   help="design 1's ranking granularity (query: all four rungs distinct; "
                        "token: head-summed scores per key, where the field's methods rank)")
    p.add_argument("--metrics", help="design 1's metrics (default: the four of the paper)")
    p.add_argument("--modes", help="design 1's modes (default comprehensiveness,sufficiency)")
    p.add_argument("--ranks", help="design 1's ranks (default signed,magnitude)")
    p.add_argument("--variant", default="",
                   help="name of a design-1 variant (e.g. query): its texts, runs and CSVs are "
                        "named d1_TAG_VARIANT, apart from the base design's")
    p.add_argument("--prose-skip", type=int, default=0,
                   help="leave out the first K selected prose texts (a pilot's)")
    p.add_argument("--design2-n", type=int, default=64, help="prose texts of design 2 (0: skip)")
    p.add_argument("--design2-fraction", type=float, default=0.2)
    p.add_argument("--design2-layers", default="all", help="layers, e.g. 0:30 or 3,7 (all)")
    p.add_argument("--gu-n", type=int, default=100, help="inputs per kind (0: skip)")
    p.add_argument("--gu-length", type=int, default=64)
    p.add_argument("--gu-bos", default="auto", choices=("auto", "both"),
                   help="both: every Gu input also with the BOS prepended where the tokenizer "
                        "has one but adds none (Qwen2.5)")
    p.add_argument("--max-hours", type=float,
                   help="attngeom faithfulness --max-hours (value zeroing's estimated limit)")
    p.add_argument("--geo-n", type=int, default=256, help="WikiText-2 chunks (0: skip)")
    p.add_argument("--geo-max-length", type=int, default=256)
    p.add_argument("--chunk-chars", type=int, default=1400)
    p.add_argument("--bootstrap", type=int, default=50, help="resamples of `attngeom analyze`")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    a = p.parse_args(argv)
    d = Path(a.data_dir)
    for key, name in (("prose", "openstax_psychology2e"), ("gsm8k", "gsm8k_test"),
                      ("wikitext", "wikitext2_raw_test")):
        if getattr(a, key) is None:
            setattr(a, key, str(d / f"{name}.jsonl"))
    here = Path(__file__).resolve().parent / a.model
    a.work = Path(a.work or here / "work_faithfulness")
    a.results = Path(a.results or here / "results_faithfulness")
    a.steps = [s.strip() for s in a.steps.split(",") if s.strip()]
    bad = [s for s in a.steps if s not in STEPS]
    if bad:
        p.error(f"--steps: unknown {','.join(bad)}; choose from {','.join(STEPS)}")
    a.fractions = tuple(float(x) for x in a.fractions.split(","))
    a.design1 = dict(DESIGN1, granularity=a.granularity)
    for key in ("metrics", "modes", "ranks"):
        if getattr(a, key):
            a.design1[key] = tuple(x.strip() for x in getattr(a, key).split(",") if x.strip())
    a.suffix = f"_{a.variant}" if a.variant else ""
    # names survey.Study's geometry step reads
    a.geo_limit, a.faith_max_length = a.geo_n, a.length
    return a


def recorded_options(nc: Path) -> dict | None:
    """The options a finished faithfulness result was computed with (None if unreadable)."""
    import xarray as xr

    try:
        with xr.open_dataset(nc) as ds:
            return json.loads(ds.attrs["attngeom_config"])["options"]
    except (OSError, KeyError, ValueError):
        return None


def units_done(partial: Path) -> int:
    """Units in the finished blocks of an interrupted run (0 when none)."""
    from attngeom.store.io.result_files import Partial

    return sum(stop - start for start, stop in Partial(partial).finished())


def same_options(recorded: dict | None, cfg) -> bool:
    """True when a result's options equal ``cfg``'s on every option in :data:`MATCH`."""
    if recorded is None:
        return False
    wanted = cfg.options()
    return all(json.dumps(recorded.get(k)) == json.dumps(wanted.get(k)) for k in MATCH)


class SecondStudy(study_plan.Planned, survey.Study):
    """Plan, text selection, the steps and their CSVs (see the module doc)."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        self.loaded = None
        self._layers: list[int] | None = None
        self.layer_types: list[str] | None = None        # the config's, when it names them
        self.per_pass: dict[str, float] = {}
        self.data = args.work / "data"

    # ------------------------------------------------------------------------ inputs
    def model(self):
        if self.loaded is None:
            import torch

            from attngeom.extract.loading.models import load

            torch.set_num_threads(self.a.threads)
            self.loaded = load(self.a.model)
        return self.loaded

    def select_texts(self) -> dict[str, tuple[Path, int]]:
        """Prose and GSM8K files of the tokenizer-selected texts, and how many there are."""
        a, tok, out = self.a, self.model().tokenizer, {}
        if not self.missing("prose", a.prose):
            path = self.data / f"prose{a.suffix}.jsonl"
            out["prose"] = path, texts.prose_texts(tok, a.prose, path, max(a.prose_n,
                                                                             a.design2_n),
                                                   a.length, skip=a.prose_skip)
        if not self.missing("gsm8k", a.gsm8k):
            path = self.data / f"gsm8k{a.suffix}.jsonl"
            out["gsm8k"] = path, texts.gsm8k_texts(tok, a.gsm8k, path, a.gsm8k_n,
                                                   a.gsm8k_min, a.length)
        for tag, (path, n) in out.items():
            want = a.prose_n if tag == "prose" else a.gsm8k_n
            if n < want:
                print(f"[study] {tag}: only {n} texts reach the length rule (asked {want})")
        return out

    def cfg(self, design: dict, n: int, fractions, layers=None):
        return plan.faith_config(**design, fractions=tuple(fractions), layers=layers,
                                 max_length=self.a.length, limit=n,
                                 batch_size=self.a.batch_size)

    def design1_cfg(self, n: int):
        return self.cfg(self.a.design1, n, self.a.fractions)

    def design2_cfg(self, layer: int):
        return self.cfg(DESIGN2, self.a.design2_n, (self.a.design2_fraction,), (layer,))

    def layers(self) -> list[int]:
        """Design 2's layers (resolved once, against the model's layer count)."""
        from attngeom.common.options.ranges import parse_ranges

        if self._layers is None:
            config = self.model().model.config
            config = config.get_text_config() if hasattr(config, "get_text_config") else config
            self.layer_types = getattr(config, "layer_types", None)
            n = self.model().info["n_layers"]
            self._layers = parse_ranges(self.a.design2_layers, range(n), "--design2-layers",
                                        "this model's layers") or list(range(n))
        return self._layers

    # ------------------------------------------------------------------------- steps
    def gu(self) -> None:
        a, done = self.a, self.a.results / "gu_sinks.csv"
        if not a.gu_n or self.missing("gu", a.wikitext) or self.skip("gu", done):
            return
        with plan.Clock() as clock:
            rows, heads = gu_sinks.gu_table(a.model, self.model().tokenizer, a.wikitext,
                                            a.work / "gu", a.gu_n, a.gu_length,
                                            batch_size=a.batch_size * 2,
                                            both=a.gu_bos == "both")
        rows.insert(0, "model", a.model)
        heads.to_csv(a.results / "gu_sinks_heads.csv", index=False)
        rows.to_csv(done, index=False)
        self.timings.append(dict(step="gu", seconds=round(clock.wall, 1),
                                 cpu_seconds=round(clock.cpu, 1)))
        self.sizes.append(dict(use="gu", data=a.wikitext, n=a.gu_n, max_length=a.gu_length))
        self.write_logs()

    def faith_run(self, step: str, data: Path, out: Path, name: str, cfg) -> Path:
        """One ``attngeom faithfulness`` run, skipped when finished with these options."""
        nc = out / f"{name}.nc"
        if nc.exists() and same_options(recorded_options(nc), cfg):
            print(f"[study] {step}: already done ({nc})", flush=True)
            return nc
        partial = out / f"{name}.partial"
        resumed, before = partial.exists(), units_done(partial)
        cmd = ["faithfulness", "--model", self.a.model, "--data", str(data), "--out", str(out),
               "--name", name, "--task", cfg.task, "--metrics", ",".join(cfg.metrics),
               "--modes", ",".join(cfg.modes), "--ranks", ",".join(cfg.ranks),
               "--fractions", ",".join(map(str, cfg.fractions)),
               "--granularity", cfg.granularity, "--max-length", str(cfg.max_length),
               "--limit", str(cfg.limit), "--batch-size", str(cfg.batch_size),
               "--no-drift", "--quiet"]
        if cfg.layers is not None:
            cmd += ["--layers", ",".join(map(str, cfg.layers))]
        if self.a.max_hours is not None:
            cmd += ["--max-hours", str(self.a.max_hours)]
        self.sh(step, *cmd)
        key = "design2" if step.startswith("design2") else "design1"
        # the passes of this invocation: a resumed run skips the units of its finished blocks
        passes = plan.n_batches(max(cfg.limit - before, 0), cfg.batch_size) \
            * plan.passes_per_batch(cfg)
        timed, done = self.per_pass.get(key), self.timings[-1]
        done.update(resumed=resumed, units_before=before, batch_passes=passes,
                    seconds_per_pass=round(done["seconds"] / passes, 3),
                    cpu_seconds_per_pass=round(done["cpu_seconds"] / passes, 3),
                    planned_cpu_seconds_per_pass=round(timed.cpu, 3) if timed else None)
        self.write_logs()
        return nc

    def design1(self, tag: str, files: dict) -> None:
        n = self.a.prose_n if tag == "prose" else self.a.gsm8k_n
        if tag not in files or not n:
            return
        path, found = files[tag]
        cfg = self.design1_cfg(min(n, found))
        name = f"d1_{tag}{self.a.suffix}"
        nc = self.faith_run(f"design1-{tag}{self.a.suffix}", path, self.a.work / f"faith_{name}",
                            name, cfg)
        export.export_design1(nc, self.a.results, name)
        if "random" in cfg.metrics:           # the ranking of every metric, against the floor
            from attngeom.analysis.faithfulness_stats import for_store

            stats, _, why = for_store(nc.parent, name)
            if stats is None:
                print(f"[study] {name}: no ranking tables ({why})", flush=True)
            else:
                export.export_stats(stats, self.a.results, name)
        figures.curves_figure(self.a.results, name)
        self.sizes.append(dict(use=name, data=getattr(self.a, tag), n=cfg.limit,
                               max_length=self.a.length, skip=self.a.prose_skip))

    def design2(self, files: dict) -> None:
        if not self.a.design2_n or "prose" not in files:
            return
        path, runs = files["prose"][0], {}
        for layer in self.layers():
            cfg = self.design2_cfg(layer)
            runs[layer] = self.faith_run(f"design2-layer{layer:02d}", path,
                                         self.a.work / "faith_d2" / f"layer{layer:02d}",
                                         f"d2_layer{layer:02d}", cfg)
        export.export_design2(runs, self.a.results, "d2_prose",
                              layer_types=self.layer_types if self.layer_types and len(
                                  set(self.layer_types)) > 1 else None)
        figures.layers_figure(self.a.results, "d2_prose")
        self.sizes.append(dict(use="d2_prose", data=self.a.prose, n=self.a.design2_n,
                               max_length=self.a.length))

    def geometry_step(self) -> None:
        a = self.a
        if not a.geo_n or self.missing("geometry", a.wikitext):
            return
        chunks = self.data / "wikitext_chunks.jsonl"
        n = prepare.geometry_texts(a.wikitext, chunks, a.geo_n, a.chunk_chars)
        self.sizes.append(dict(use="geo_wikitext", data=a.wikitext, n=n,
                               max_length=a.geo_max_length))
        self.geometry("wikitext", chunks, "text")

    def geometry_prose(self, files: dict) -> None:
        """The geometry on design 1's prose texts, at their length (``--length``)."""
        if "prose" not in files:
            return
        path, n = files["prose"]
        n = min(n, self.a.prose_n)
        self.sizes.append(dict(use=f"geo_prose{self.a.suffix}", data=self.a.prose, n=n,
                               max_length=self.a.length, skip=self.a.prose_skip))
        self.geometry(f"prose{self.a.suffix}", path, "text", self.a.length, n)

    def release(self) -> None:
        """Free the in-process model before the CLI steps load their own copy."""
        self.loaded = None
        gc.collect()

    # --------------------------------------------------------------------------- run
    def run(self) -> None:
        a = self.a
        a.results.mkdir(parents=True, exist_ok=True)
        files = self.select_texts()
        saved = a.results / f"plan{a.suffix}.csv"
        if a.reuse_plan and saved.exists() and not a.plan:
            print(f"[study] plan (timed {pd.read_csv(saved)['timed'].iloc[0]}):")
            print(pd.read_csv(saved).drop(columns=["model", "timed"]).to_string(index=False))
        else:
            self.plan(files)
        if a.plan:
            return
        if "gu" in a.steps:
            self.gu()
        if "design2" in a.steps and a.design2_n:
            self.layers()                 # resolve the layer list while the model is loaded
        self.release()
        for tag in ("prose", "gsm8k"):
            if f"design1-{tag}" in a.steps:
                self.design1(tag, files)
        if "design2" in a.steps:
            self.design2(files)
        if "geometry" in a.steps:
            self.geometry_step()
        if "geometry-prose" in a.steps:
            self.geometry_prose(files)
        self.write_logs()


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    try:
        SecondStudy(a).run()
    except subprocess.CalledProcessError as exc:
        print(f"[study] a step failed (exit {exc.returncode}): {' '.join(exc.cmd[1:4])} ...; "
              "fix it and rerun the same command: finished steps and blocks are kept",
              file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        print(f"[study] {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
