"""Compare a rerun of some design-2 layers with the committed design-2 CSVs.

A rerun of a few layers (``faithfulness_study.py --steps design2 --design2-layers 3,20 --results
DIR``) is tested over its own family of layers; the committed tables used all of them. So the
verdicts are compared after putting the rerun's p-values into the committed family (Holm over
every layer, as ``studies/export.py`` does), and the per-unit perplexities are compared directly.

Usage: python studies/check_layer_resume.py DIR [--committed studies/smollm2-135m/results_faithfulness]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

UNIT_KEYS = ["metric", "sequence", "rank", "mode", "fraction", "layer"]
STEP_KEYS = ["mode", "rank", "lower", "higher"]


def compare_units(new: pd.DataFrame, old: pd.DataFrame) -> pd.DataFrame:
    """Largest relative and absolute difference per outcome, over the rerun's units."""
    m = new.merge(old, on=UNIT_KEYS, suffixes=("", "_old"), validate="one_to_one")
    assert len(m) == len(new), "the rerun has units the committed CSV lacks"
    rows = []
    for c in ("ppl", "clean_ppl", "log_ppl_ratio"):
        diff = (m[c] - m[f"{c}_old"]).abs()
        rows.append(dict(outcome=c, n=len(m), max_abs=diff.max(),
                         max_rel=(diff / m[f"{c}_old"].abs()).max()))
    return pd.DataFrame(rows)


def compare_verdicts(new: pd.DataFrame, old: pd.DataFrame) -> pd.DataFrame:
    """Per (step, rerun layer): the committed and the rerun's Holm p over the committed family."""
    out = []
    for key, family in old.groupby(STEP_KEYS):
        family = family.set_index("layer").copy()
        mine = new.set_index(STEP_KEYS).loc[key].set_index("layer")
        family.loc[mine.index, "p_value"] = mine["p_value"]
        family["p_holm_rerun"] = multipletests(family["p_value"], method="holm")[1]
        for layer, r in mine.iterrows():
            f = family.loc[layer]
            out.append(dict(zip(STEP_KEYS, key), layer=layer,
                            aopc_rel=abs(r.aopc_higher / f.aopc_higher - 1),
                            improvement=r.mean_improvement,
                            improvement_old=old.set_index(STEP_KEYS + ["layer"]).loc[
                                (*key, layer), "mean_improvement"],
                            p_holm_old=old.set_index(STEP_KEYS + ["layer"]).loc[
                                (*key, layer), "p_holm"],
                            p_holm_rerun=f.p_holm_rerun,
                            same_decision=(f.p_holm_rerun < 0.05) == (
                                old.set_index(STEP_KEYS + ["layer"]).loc[(*key, layer),
                                                                          "p_holm"] < 0.05)))
    return pd.DataFrame(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rerun", type=Path)
    p.add_argument("--committed", type=Path,
                   default=Path("studies/smollm2-135m/results_faithfulness"))
    a = p.parse_args()
    read = lambda d, n: pd.read_csv(d / f"d2_prose_{n}.csv")      # noqa: E731
    pd.set_option("display.width", 200)
    print(compare_units(read(a.rerun, "units"), read(a.committed, "units")).to_string(index=False))
    print(compare_verdicts(read(a.rerun, "layers"), read(a.committed, "layers")).to_string(
        index=False, float_format=lambda x: f"{x:.4g}"))


if __name__ == "__main__":
    np.seterr(all="raise")
    main()
