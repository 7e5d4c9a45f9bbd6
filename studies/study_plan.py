"""The plan of the faithfulness study (studies/faithfulness_study.py): each step's forward passes
and the hours they take, timed on one batch of the study's own texts before anything runs.

A mixin of :class:`faithfulness_study.SecondStudy`: it reads the study's options (``self.a``),
its loaded model (``self.model()``), its text files and design-2 layers.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

import plan
import prepare
import texts


class Planned:
    """The plan's steps (see the module doc)."""

    def plan(self, files: dict) -> pd.DataFrame:
        """Time one batch per kind of step, print the plan and write RESULTS/plan.csv."""
        a = self.a
        steps = [self.plan_gu()] + [self.plan_design1(tag, files) for tag in ("prose", "gsm8k")]
        steps += [self.plan_design2(files), self.plan_geometry(), self.plan_geometry_prose(files)]
        frame = plan.table([s for s in steps if s is not None])
        frame.insert(0, "model", a.model)
        frame["timed"] = time.strftime("%Y-%m-%d %H:%M")
        print(f"[study] plan for {a.model} (seconds per pass timed now, {a.threads} thread(s); "
              "CPU-hours from process CPU time, wall hours at the machine's present load):")
        print(frame.drop(columns=["model", "timed"]).to_string(index=False))
        a.results.mkdir(parents=True, exist_ok=True)
        frame.to_csv(a.results / f"plan{a.suffix}.csv", index=False)
        return frame

    def plan_gu(self) -> plan.Step | None:
        a = self.a
        if "gu" not in a.steps or not a.gu_n or not Path(a.wikitext).exists():
            return None
        tok = self.model().tokenizer
        timed = plan.time_measure(self.model().model, texts.random_inputs(tok, a.batch_size * 2,
                                                                          a.gu_length))
        kinds = 3 + 3 * int(texts.adds_bos(tok) or a.gu_bos == "both")
        return plan.Step("gu", a.gu_n, a.batch_size * 2, kinds, timed, a.threads,
                         note=f"{kinds} input kinds x {a.gu_n} inputs, measure passes")

    def plan_design1(self, tag: str, files: dict) -> plan.Step | None:
        a = self.a
        n = a.prose_n if tag == "prose" else a.gsm8k_n
        if f"design1-{tag}" not in a.steps or tag not in files or not n:
            return None
        data, cfg = str(files[tag][0]), self.design1_cfg(min(n, files[tag][1]))
        if "design1" not in self.per_pass:
            self.per_pass["design1"] = plan.time_faithfulness(self.model(), data, cfg)
            plain = plan.time_plain(self.model(), data, cfg)
            self.per_pass["plain"] = plain
            print(f"[study] one removal pass: {self.per_pass['design1'].cpu:.2f} CPU s, a plain "
                  f"forward of the same batch: {plain.cpu:.2f} CPU s "
                  f"({self.per_pass['design1'].cpu / plain.cpu:.1f}x)")
        ratio = self.per_pass["design1"].cpu / self.per_pass["plain"].cpu
        return plan.Step(f"design1-{tag}", cfg.limit, a.batch_size, plan.passes_per_batch(cfg),
                         self.per_pass["design1"], a.threads,
                         note=f"a removal pass costs {ratio:.1f}x a plain forward (CPU time)")

    def plan_design2(self, files: dict) -> plan.Step | None:
        a = self.a
        if "design2" not in a.steps or not a.design2_n or "prose" not in files:
            return None
        layers = self.layers()
        cfg = self.design2_cfg(layers[len(layers) // 2])
        timed = plan.time_faithfulness(self.model(), str(files["prose"][0]), cfg)
        self.per_pass["design2"] = timed
        return plan.Step("design2", cfg.limit, a.batch_size, plan.passes_per_batch(cfg), timed,
                         a.threads, runs=len(layers),
                         note=f"one run per layer ({len(layers)}), each with its clean pass")

    def plan_geometry(self) -> plan.Step | None:
        a = self.a
        if "geometry" not in a.steps or not a.geo_n or not Path(a.wikitext).exists():
            return None
        chunks = self.data / "wikitext_chunks.jsonl"
        prepare.geometry_texts(a.wikitext, chunks, a.geo_n, a.chunk_chars)
        ids = texts.chunk_ids(self.model().tokenizer, chunks, a.batch_size, a.geo_max_length)
        return plan.Step("geometry", a.geo_n, len(ids), 1,
                         plan.time_measure(self.model().model, ids), a.threads,
                         note="extract passes only; `attngeom analyze` comes on top "
                              "(first study: 130 s at 64 chunks)")

    def plan_geometry_prose(self, files: dict) -> plan.Step | None:
        a = self.a
        if "geometry-prose" not in a.steps or "prose" not in files:
            return None
        n = min(files["prose"][1], a.prose_n)
        ids = texts.chunk_ids(self.model().tokenizer, files["prose"][0], a.batch_size, a.length)
        return plan.Step(f"geometry-prose{a.suffix}", n, len(ids), 1,
                         plan.time_measure(self.model().model, ids), a.threads,
                         note=f"extract passes at {a.length} tokens; `attngeom analyze` on top")

