"""Options declared once (attngeom.store.options.stages): the parsers, the configs and the checks.

No torch: the command line's parsers are built and read here, without running a command.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from attngeom.cli import build_parser
from attngeom.store.options import stages as O
from attngeom.store.options.ranges import check_syntax, parse_ranges


def parse(*argv: str) -> argparse.Namespace:
    return build_parser(list(argv)).parse_args(list(argv))


def test_every_declared_option_is_on_its_command_with_its_default():
    for command, classes in (("extract", (O.ExtractCommand, O.ExtractConfig)),
                             ("faithfulness", (O.FaithCommand, O.FaithConfig)),
                             ("analyze", (O.AnalyzeCommand, O.AnalysisOptions))):
        sub = build_parser([command])._subparsers._group_actions[0].choices[command]
        by_dest = {a.dest: a for a in sub._actions}
        for cls in classes:
            for f in dataclasses.fields(cls):
                action = by_dest[f.name]
                assert f.metadata["help"] in action.help, (command, f.name)
                if f.metadata["kind"] not in ("flag", "negated") and not f.metadata["required"]:
                    assert action.default == f.default, (command, f.name)


def test_a_command_line_becomes_the_config_the_api_takes():
    args = parse("extract", "--model", "m", "--data", "d", "--out", "o", "--no-text",
                 "--sink-k", "2", "--shard-size", "3", "--shard", "1/2")
    cfg, cmd = O.from_args(args, O.ExtractConfig), O.from_args(args, O.ExtractCommand)
    assert cfg == O.ExtractConfig(store_text=False, sink_k=2, shard_size=3)
    assert (cmd.model, cmd.data, cmd.out, cmd.shard) == ("m", "d", "o", "1/2")
    args = parse("faithfulness", "--model", "m", "--data", "d", "--out", "o", "--rank",
                 "magnitude", "--fractions", "0.5,0.1", "--metrics", "attention,contribution",
                 "--no-drift", "--layers", "0:2,5")
    cfg = O.from_args(args, O.FaithConfig)
    assert cfg.ranks == ("magnitude",) and cfg.fractions == (0.5, 0.1) and not cfg.drift
    assert cfg.metrics == ("attention", "contribution") and cfg.layers == "0:2,5"
    assert cfg.modes == ("comprehensiveness", "sufficiency") and cfg.k_shot == 5
    args = parse("report", "STORE", "--bootstrap", "7", "--epsilon", "0.2")
    assert O.from_args(args, O.AnalysisOptions) == O.AnalysisOptions(n_boot=7, epsilon=0.2)
    assert not hasattr(args, "layers")                      # report takes four of them


def test_run_takes_smaller_defaults_and_shares_options_between_stages():
    args = parse("run", "--max-length", "64", "--faith-limit", "3")
    extract, faith = O.from_args(args, O.ExtractConfig), O.from_args(args, O.FaithConfig)
    assert (extract.limit, extract.max_length) == (48, 64)
    assert faith.max_length == 64 and faith.fractions == (0.1, 0.25, 0.5)
    assert faith.metrics == ("attention", "value_weighted", "value_weighted_normalized",
                             "contribution")
    assert O.from_args(args, O.RunOptions).faith_limit == 3


@pytest.mark.parametrize("cfg, words", [
    (O.ExtractConfig(max_length=0), ["--max-length must be at least 1, not 0"]),
    (O.ExtractConfig(mode="sparse"), ["--mode", "sparse", "compact"]),
    (O.ExtractConfig(sink_k=8, max_length=8), ["--sink-k 8", "--max-length 8"]),
    (O.FaithConfig(metrics=("attention", "attention")), ["--metrics", "distinct"]),
    (O.FaithConfig(ranks=("signed", "abs")), ["--ranks signed,abs"]),
    (O.FaithConfig(fractions=(0.1, 1.5)), ["--fractions", "[0, 1]"]),
    (O.FaithConfig(fractions=()), ["--fractions"]),
    (O.FaithConfig(drift_low_fraction=0.0), ["--drift-low-fraction", "(0, 1]"]),
    (O.FaithConfig(k_shot=-1), ["--k-shot must be at least 0"]),
    (O.FaithConfig(name="a b"), ["--name 'a b'"]),
    (O.FaithConfig(layers="x"), ["--layers 'x'"]),
    (O.FaithConfig(layers=(1, -2)), ["--layers"]),
    (O.AnalysisOptions(n_boot=-1), ["--bootstrap must be at least 0, not -1"]),
    (O.AnalysisOptions(level=1.0), ["--level 1.0 must be in (0, 1)"]),
    (O.AnalysisOptions(sink_k=0), ["--sink-k must be at least 1"]),
])
def test_check_names_the_option_and_the_fix(cfg, words):
    with pytest.raises(ValueError) as info:
        cfg.check()
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert "\n" not in str(info.value)


def test_valid_configs_pass_their_check():
    for cfg in (O.ExtractConfig(), O.ExtractConfig(sink_k=7, max_length=8), O.FaithConfig(),
                O.FaithConfig(layers="3:", fractions=(0.0, 1.0)), O.AnalysisOptions(layers="1:")):
        cfg.check()
    O.RunOptions(faith_limit=4).check(O.ExtractConfig(limit=4))
    with pytest.raises(ValueError, match="--faith-limit must be between 0 and --limit"):
        O.RunOptions(faith_limit=5).check(O.ExtractConfig(limit=4))


def test_identity_is_what_the_store_records():
    # the keys a faithfulness result has always recorded (the identity of a run)
    assert set(O.FaithConfig().options()) == {
        "task", "metrics", "modes", "ranks", "fractions", "granularity", "layers", "max_length",
        "limit", "text_field", "dev", "k_shot", "drift", "sink_k", "drift_low_fraction",
        "block_size", "dtype"}
    assert O.FaithConfig(fractions=(0.2,)).options()["fractions"] == [0.2]
    cfg = O.ExtractConfig(mode="dense", limit=3)
    recorded = {"options": {"mode": "dense", "sink_k": 1, "tail_w": 8, "max_length": 512,
                            "shard_size": 17, "store_text": True},
                "data": {"limit": 3, "text_field": None, "sha256": "x"}}
    assert O.mismatches(cfg, recorded) == []                  # shard_size None: chosen by the run
    assert O.mismatches(dataclasses.replace(cfg, shard_size=16), recorded) == [
        "shard_size: 17 -> 16"]
    assert O.mismatches(dataclasses.replace(cfg, tail_w=4, limit=None), recorded) == [
        "tail_w: 8 -> 4", "limit: 3 -> None"]
    assert O.mismatches(cfg, {"options": {}}) != []


def test_provenance_takes_the_option_names():
    opts = O.AnalysisOptions(epsilon=0.4, n_boot=9, layers="0:2")
    assert O.provenance(opts, sink_k=2, tail_w=3) == dict(
        sink_k=2, tail_w=3, epsilon=0.4, n_boot=9, seed=0, level=0.05)


def test_range_syntax_check_allows_open_ends_and_refuses_the_rest():
    assert check_syntax("5:", "--layers") == "5:" and check_syntax("all") == "all"
    assert parse_ranges("5:", range(8)) == [5, 6, 7] and parse_ranges("1-2,0:1") == [0, 1, 2]
    for bad in ("a-b", "", "-3", "1-"):
        with pytest.raises(ValueError, match="--layers"):
            check_syntax(bad, "--layers")
