"""Options declared once (attngeom.store.options.stages): the parsers, the configs and the checks.

No torch: the command line's parsers are built and read here, without running a command.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from attngeom.cli import build_parser, main
from attngeom.common.options import commands as C
from attngeom.store.options import stages as O
from attngeom.store.options.ranges import check_syntax, parse_ranges
from attngeom.common.options.constraints import AtLeast, Interval, Items


def parse(*argv: str) -> argparse.Namespace:
    return build_parser(list(argv)).parse_args(list(argv))


def test_every_declared_option_is_on_its_command_with_its_default():
    for command, classes in (("extract", (C.ExtractCommand, O.ExtractConfig)),
                             ("faithfulness", (C.FaithCommand, O.FaithConfig)),
                             ("analyze", (C.AnalyzeCommand, O.AnalysisOptions))):
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
    cfg, cmd = O.from_args(args, O.ExtractConfig), O.from_args(args, C.ExtractCommand)
    assert cfg == O.ExtractConfig(store_text=False, sink_k=2, shard_size=3)
    assert (cmd.model, cmd.data, cmd.out, cmd.part) == ("m", "d", "o", "1/2")   # --shard: alias
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
                             "contribution", "random")      # the floor runs by default
    assert O.from_args(args, C.RunOptions).faith_limit == 3


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
    (O.AnalysisOptions(n_boot=-1), ["--n-boot must be at least 0, not -1"]),
    (O.AnalysisOptions(level=1.0), ["--level 1.0 must be in (0, 1)"]),
    (O.AnalysisOptions(sink_k=0), ["--sink-k must be at least 1"]),
    (O.AnalysisOptions(epsilon=2), ["--epsilon 2 must be in (0, 1)"]),
    (O.AnalysisOptions(epsilon=0.0), ["--epsilon 0.0 must be in (0, 1)"]),
    (O.AnalysisOptions(epsilon=float("nan")), ["--epsilon nan must be in (0, 1)"]),
    (O.AnalysisOptions(seed=-1), ["--seed must be at least 0, not -1"]),
    (O.ExtractConfig(tail_w=2.5), ["--tail-w must be an integer of at least 1, not 2.5"]),
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
    C.RunOptions(faith_limit=4).check(O.ExtractConfig(limit=4))
    with pytest.raises(ValueError, match="--faith-limit must be between 0 and --limit"):
        C.RunOptions(faith_limit=5).check(O.ExtractConfig(limit=4))


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


# ----------------------------------------------------------------------------- ranges
FAITH = ("faithfulness", "--model", "m", "--data", "d", "--out", "o")
ANALYZE = ("analyze", "STORE", "--out", "o")


@pytest.mark.parametrize("argv, words", [
    (ANALYZE + ("--epsilon", "2"), ["argument --epsilon: 2.0 must be in (0, 1)"]),
    (ANALYZE + ("--epsilon", "0"), ["--epsilon", "0.0", "(0, 1)"]),          # an open end
    (ANALYZE + ("--level", "1"), ["--level", "1.0", "(0, 1)"]),
    (ANALYZE + ("--seed", "-1"), ["--seed", "at least 0, not -1"]),
    (FAITH + ("--fractions", "0.1,1.5"), ["argument --fractions", "0.1,1.5", "[0, 1]"]),
    (FAITH + ("--drift-low-fraction", "0"), ["--drift-low-fraction", "0.0", "(0, 1]"]),
    (("run", "--fractions", "1.5"), ["--fractions", "1.5", "[0, 1]"]),
    (("run", "--bootstrap", "-1"), ["--bootstrap", "at least 0, not -1"]),
])
def test_a_value_outside_its_range_is_a_one_line_usage_error(argv, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert info.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"attngeom {argv[0]}: error: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_values_on_the_closed_ends_of_a_range_are_accepted():
    args = parse(*FAITH, "--fractions", "0,1", "--drift-low-fraction", "1", "--k-shot", "0",
                 "--max-length", "2", "--sink-k", "1")
    cfg = O.from_args(args, O.FaithConfig)
    assert (cfg.fractions, cfg.drift_low_fraction, cfg.k_shot) == ((0.0, 1.0), 1.0, 0)
    cfg.check()
    args = parse(*ANALYZE, "--epsilon", "0.999", "--level", "1e-9", "--bootstrap", "0",
                 "--seed", "0", "--sink-k", "1", "--tail-w", "1")
    opts = O.from_args(args, O.AnalysisOptions)
    assert (opts.epsilon, opts.level, opts.n_boot, opts.seed) == (0.999, 1e-9, 0, 0)
    opts.check()
    O.ExtractConfig(max_length=2, batch_size=1, limit=1, shard_size=1).check()


STAGE_CLASSES = (O.ExtractConfig, O.FaithConfig, O.AnalysisOptions, *C.DECLARED)


def test_every_numeric_option_declares_its_range_and_its_help_shows_it():
    numeric = 0
    for cls in STAGE_CLASSES:
        for f in dataclasses.fields(cls):
            m = f.metadata
            kind = m["type"] or type(f.default)
            if m["kind"] != "numbers" and (m["kind"] or kind not in (int, float)):
                continue
            numeric += 1
            c = m["constraint"]
            c = c.each if isinstance(c, Items) else c
            assert isinstance(c, (AtLeast, Interval)), (cls.__name__, f.name)
    assert numeric >= 20                     # the walk above found the numeric options
    sub = build_parser(["analyze"])._subparsers._group_actions[0].choices["analyze"]
    helps = {a.dest: a.help for a in sub._actions}
    assert helps["epsilon"].endswith("(default 0.3; in (0, 1))")
    assert helps["n_boot"].endswith("(default 200; at least 0)")


def _actions(parser: argparse.ArgumentParser):
    """Every argument of a parser and of its sub-parsers (store and models actions)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)
        elif not isinstance(action, argparse._HelpAction):
            yield action


def test_every_command_s_options_come_from_the_declarations():
    from attngeom.cli import COMMANDS

    declared = {f.name for cls in (O.ExtractConfig, O.FaithConfig, O.AnalysisOptions,
                                   *C.DECLARED) for f in dataclasses.fields(cls)}
    for name in COMMANDS:
        sub = build_parser([name])._subparsers._group_actions[0].choices[name]
        found = {a.dest for a in _actions(sub)}
        assert found and found <= declared, (name, sorted(found - declared))


def test_one_name_per_idea_with_the_old_spellings_as_aliases():
    for command, old, new in (("analyze", "--no-progress", "--quiet"),
                              ("analyze", "--bootstrap", "--n-boot"),
                              ("extract", "--shard", "--part")):
        sub = build_parser([command])._subparsers._group_actions[0].choices[command]
        action = next(a for a in sub._actions if new in a.option_strings)
        assert old in action.option_strings and old in action.help, (command, old)


def test_every_alias_s_help_says_it_is_one():
    """Issue 42: an option's other spellings are aliases whose help says so, on every command."""
    from attngeom.cli import COMMANDS

    aliases = []
    for name in COMMANDS:
        sub = build_parser([name])._subparsers._group_actions[0].choices[name]
        for action in _actions(sub):
            for old in [s for s in action.option_strings if s.startswith("--")][1:]:
                aliases.append((name, old))
                assert f"{old}: the same, its earlier name" in action.help, (name, old)
    assert ("faithfulness", "--rank") in aliases and ("extract", "--shard") in aliases
