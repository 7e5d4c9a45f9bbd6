"""The dataset card (README.md) of a Hugging Face dataset export (``store export --format hf``).

YAML metadata first (license, pretty_name, tags, size category, one config per table with
its data_files), then what the tables hold: every column with its definition (the store's
variables from :mod:`attngeom.store.format.schema`, units from :mod:`attngeom.store.io.readme`;
a faithfulness result's from the result file), how to load and upload, provenance (the source
store's README.txt) and the citation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..format import schema as S
from ..io.readme import UNITS, readme_text
from ..io.results import entries as result_entries
from ..io.results import is_faith_only
from attngeom.common.errors import Refusal

DEFAULT_LICENSE = "unknown"
TAGS = ("attngeom", "interpretability", "attention", "attention-sinks", "contribution-weights")
TABLE_TEXT = {
    "per_query": "one row per (sequence, layer, head, query): per-query variables "
                 "(layer_output_norm repeated over heads)",
    "per_key": "one row per (sequence, layer, head, key): per-key variables",
    "pairs": "one row per (sequence, layer, head, query, key) the store keeps: pair variables "
             "(compact stores: the sink keys and the tail window only; masked pairs left out)",
    "sequences": "one row per sequence: length, truncation, finiteness, index of the text",
    "tokens": "one row per (sequence, position): the tokens",
}
INDEX_COLUMNS = {
    S.SEQUENCE: "sequence number (one text each, 0..n-1)",
    S.LAYER: "layer number",
    S.HEAD: "query head number (with grouped-query attention several share a key/value head)",
    S.QUERY: "query token position i",
    S.KEY: "key token position j",
    S.POSITION: "token position",
    S.LAG: "query - key for tail-window keys; -1 on sink rows",
    "group": "sink (the first k keys) or tail (the w most recent non-sink keys up to the query)",
}
SIZES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
         (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"),
         (1_000_000_000, "100M<n<1B"))
CITATION = """\
@inproceedings{cunningham2026contribution,
  title     = {Contribution Weights: A Geometrical Analysis of Self-Attention Transformers},
  author    = {Cunningham and Mu{\\c{c}}a Cirone},
  booktitle = {International Conference on Machine Learning (ICML)},
  year      = {2026},
  note      = {arXiv:2606.07604}
}"""


def check_license(license: str | None) -> str:
    """The card's license identifier (a Hub license id such as mit, cc-by-4.0, other)."""
    if license is None:
        return DEFAULT_LICENSE
    if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", license):
        raise Refusal(f"--license '{license}': give a Hugging Face license identifier in "
                         "lower case, e.g. mit, apache-2.0, cc-by-4.0, other")
    return license


def _q(text: str) -> str:
    """A YAML scalar: JSON's double-quoted strings are valid YAML."""
    return json.dumps(str(text), ensure_ascii=False)


def _files(out: Path, pattern: str) -> list[Path]:
    return sorted(out.glob(pattern))


def _rows(files: list[Path]) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def _size_category(rows: int) -> str:
    return next((name for top, name in SIZES if rows < top), "n>1T")


def _yaml(configs: dict[str, str], license: str, pretty: str, tags: list[str],
          rows: int) -> str:
    lines = ["---", f"license: {license}", f"pretty_name: {_q(pretty)}", "tags:"]
    lines += [f"- {_q(t)}" for t in tags]
    lines += ["size_categories:", f"- {_q(_size_category(rows))}", "configs:"]
    for n, (name, pattern) in enumerate(configs.items()):
        lines += [f"- config_name: {_q(name)}", "  data_files:", "  - split: train",
                  f"    path: {_q(pattern)}"]
        if n == 0:
            lines.append("  default: true")
    return "\n".join(lines + ["---", ""])


def _definition(column: str, results: dict[str, str]) -> str:
    if column in INDEX_COLUMNS:
        return INDEX_COLUMNS[column]
    if column in results:
        return results[column]
    text = S.DESCRIPTIONS.get(column, S.DESCRIPTIONS.get(f"tail_{column}", ""))
    units = UNITS.get(column, "")
    return f"{text} [{units}]" if units else text


def _result_descriptions(out: Path, manifest: dict) -> dict[str, str]:
    """Column definitions of the faithfulness results (their netCDF attrs)."""
    import xarray as xr

    found: dict[str, str] = {}
    for entry in result_entries(manifest).values():
        path = out / Path(entry["file"]).name
        if path.is_file():
            with xr.open_dataset(path, engine="h5netcdf") as res:
                for name, var in res.variables.items():
                    found.setdefault(str(name), str(var.attrs.get("description", "")))
    return found


def _table_section(out: Path, name: str, pattern: str, results: dict[str, str]) -> list[str]:
    import pyarrow.parquet as pq

    files = _files(out, pattern)
    schema = pq.read_schema(files[0])
    text = TABLE_TEXT.get(name, "a faithfulness result: one row per cell of these dims")
    lines = [f"### `{name}`", "", f"{text}; {_rows(files)} rows in {len(files)} file(s) "
             f"`{pattern}`.", "", "| column | type | definition |", "|---|---|---|"]
    for field in schema:
        lines.append(f"| `{field.name}` | {field.type} | "
                     f"{_definition(field.name, results).replace('|', '/')} |")
    return lines + [""]


def dataset_card(manifest: dict, out: Path, configs: dict[str, str], license: str | None = None,
                 no_text: bool = False, store: Path | None = None) -> str:
    """README.md of the export at ``out`` holding ``configs`` (table -> data_files pattern)."""
    license = check_license(license)
    if not configs:
        raise Refusal("nothing to export: the store has no tables or results")
    cfg = manifest["config"]
    model, data = cfg.get("model", {}), cfg.get("data", {})
    pretty = f"attngeom: {model.get('id', 'model')} on {data.get('spec', 'results')}"
    tags = list(TAGS) + ([str(model["model_type"])] if model.get("model_type") else [])
    rows = max(_rows(_files(out, p)) for p in configs.values())
    results = _result_descriptions(out, manifest)
    first = next(iter(configs))
    opts = cfg.get("options", {})
    layout = ("" if is_faith_only(manifest) else
              f" Layout: {opts.get('mode')} (sink keys k = {opts.get('sink_k')}, tail window "
              f"w = {opts.get('tail_w')}, at most {opts.get('max_length')} tokens per text).")
    lines = [
        _yaml(configs, license, pretty, tags, rows),
        f"# {pretty}", "",
        f"Per-head attention geometry of `{model.get('id')}` ({model.get('architecture')}, "
        f"{model.get('n_layers')} layers x {model.get('n_heads')} heads) over "
        f"`{data.get('spec')}`, measured with attngeom: attention weights, projected-value "
        "norms, output norms and cosines, from which the contribution weights "
        "c_ij^h = α_ij^h ‖ṽ_j^h‖ cos(o_i^h, ṽ_j^h) / ‖o_i^h‖ follow exactly (Cunningham and "
        f"Muça Cirone, ICML 2026); they are included.{layout} Content hash "
        f"`{manifest['config_hash']}`." + (" Token strings were left out (`--no-text`); token "
                                           "ids remain." if no_text else ""), "",
        "## Loading", "", "```python", "from datasets import load_dataset", "",
        f'rows = load_dataset("USER/NAME", "{first}", split="train")   # or a local folder',
        "frame = rows.to_pandas()", "```", "",
        "Long tables, one row per cell inside each sequence's length. Join `pairs`, `per_key` "
        "and `per_query` on (sequence, layer, head, query/key) to rebuild any score, e.g. "
        "value-weighted attention α‖ṽ‖. Configs: " + ", ".join(f"`{c}`" for c in configs) + ".",
        "", "## Getting the store back", "",
        "The tables hold every measured value, so attngeom rebuilds the store they came from "
        "(same content hash; `attngeom analyze`, `report`, `view` and `compare` then run on it; "
        "each file's sha256 in `manifest.source.json` is checked first):", "", "```bash",
        "hf download USER/NAME --repo-type dataset --local-dir NAME",
        "attngeom store import NAME --out NAME.store", "```", "",
        "## Tables", "",
    ]
    for name, pattern in configs.items():
        lines += _table_section(out, name, pattern, results)
    lines += [
        "## Files", "",
        "- `data/<config>/train-NNNNN-of-NNNNN.parquet`: the tables (one file per store shard); "
        "each file's metadata holds `attngeom_manifest`",
        "- `manifest.source.json`: the source store's manifest (provenance, options, "
        "checksums) and, under `export`, the tables exported and the sha256 of every data file",
        "- `<name>.nc`: each faithfulness result as written by attngeom (netCDF4)"
        if results else "", "",
        "## Uploading", "", "```bash",
        "hf upload USER/NAME path/to/this/folder --repo-type dataset",
        "# huggingface_hub < 1.0: huggingface-cli upload USER/NAME path/to/this/folder "
        "--repo-type dataset", "```", "",
        "## Provenance: the source store's description", "", "<details>", "", "```text",
        readme_text(manifest, store).rstrip(), "```", "", "</details>", "",
        "## Citation", "", "```bibtex", CITATION, "```", "",
    ]
    return "\n".join(lines)
