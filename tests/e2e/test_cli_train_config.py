"""`fcp train`'s options are derived from :class:`TrainConfig` (fcp_exec.commands.add_config_options): one
option per plain-valued field with the dataclass's default, type, choices and help; a new field appears without
a second edit; a field with no command-line form must say so. Reference: ``dataclasses.fields(TrainConfig)``."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from fcp_cli.main import build_parser
from fcp_exec.commands import add_config_options, cli_fields, config_kwargs
from fcp_exec.commands.train import config_from_args, register
from fcp_exec.train_config import TrainConfig

# the fields that are API-only or take a form the CLI builds itself (--cost FILE, --json)
NOT_ON_THE_CLI = {"synthetic_lengths", "cost", "json_lines", "verbose", "return_params", "return_grads"}


def _train_parser() -> argparse.ArgumentParser:
    """The parser `fcp train` registers."""
    sub = argparse.ArgumentParser().add_subparsers()
    register(sub, "train")
    return sub.choices["train"]


def test_every_plain_field_is_an_option_with_the_dataclass_default():
    """Every TrainConfig field but the listed API-only ones is an option; parsing no arguments gives each field
    its dataclass default (so `fcp train` and TrainConfig() agree: steps 3), and the TrainConfig built from it
    equals TrainConfig() apart from the CLI-only output switch."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    derived = {f.name for f in cli_fields(TrainConfig)}
    assert derived == set(fields) - NOT_ON_THE_CLI
    parser = _train_parser()
    options = {a.dest: a for a in parser._actions}
    args = parser.parse_args([])
    assert vars(build_parser("train").parse_args(["train"])).items() >= vars(args).items()  # what `fcp` parses
    for name in derived:
        assert options[name].option_strings == ["--" + name.replace("_", "-")]
        assert getattr(args, name) == fields[name].default, name
        assert options[name].choices == fields[name].metadata.get("choices"), name
    assert args.steps == TrainConfig().steps == 3
    assert config_from_args(args) == TrainConfig()


def test_parsed_values_reach_the_config():
    """Typed values of derived options, and the hand-written ones (--cost FILE, --json), reach TrainConfig; a
    value outside a field's choices is refused by the parser."""
    parser = _train_parser()
    args = parser.parse_args(["--steps", "7", "--lr", "0.5", "--weight-decay", "0", "--prefetch", "0", "--dtype",
                              "float64", "--num-synthetic", "5", "--reducer", "ddp", "--data", "synthetic", "--json"])
    cfg = config_from_args(args)
    assert (cfg.steps, cfg.lr, cfg.weight_decay, cfg.prefetch, cfg.dtype, cfg.num_synthetic, cfg.reducer, cfg.data) \
        == (7, 0.5, 0.0, 0, "float64", 5, "ddp", "synthetic")
    assert cfg.json_lines and not cfg.verbose and cfg.cost is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--dtype", "float16"])


def test_cost_file_is_read(tmp_path):
    from fcp_exec.train import builtin_cost_model

    path = tmp_path / "cost.json"
    path.write_text(json.dumps(builtin_cost_model(256, 2).to_dict()))
    cfg = config_from_args(_train_parser().parse_args(["--cost", str(path)]))
    assert cfg.cost == builtin_cost_model(256, 2).to_dict() and cfg.verbose


def test_a_new_field_appears_and_a_field_without_a_cli_form_must_say_so():
    """A config that adds fields gets their options with no other edit: an int (default and help), an optional
    float, a bool flag and a bool defaulting to True (--x/--no-x); a dict field without cli=False is a
    TypeError naming it."""
    extended = dataclasses.make_dataclass(
        "Extended", [("new_knob", int, dataclasses.field(default=7, metadata={"help": "a new knob"})),
                     ("ratio", float | None, dataclasses.field(default=None)),
                     ("flag", bool, dataclasses.field(default=False)),
                     ("on", bool, dataclasses.field(default=True))],
        bases=(TrainConfig,), frozen=True, kw_only=True)
    parser = argparse.ArgumentParser()
    add_config_options(parser, extended)
    args = parser.parse_args([])
    assert (args.new_knob, args.ratio, args.flag, args.on, args.steps) == (7, None, False, True, 3)
    assert "a new knob (default 7)" in " ".join(parser.format_help().split())
    args = parser.parse_args(["--new-knob", "9", "--ratio", "0.25", "--flag", "--no-on"])
    kwargs = config_kwargs(extended, args)
    assert (kwargs["new_knob"], kwargs["ratio"], kwargs["flag"], kwargs["on"]) == (9, 0.25, True, False)
    assert extended(**kwargs).new_knob == 9

    bad = dataclasses.make_dataclass("Bad", [("table", dict, dataclasses.field(default=None))])
    with pytest.raises(TypeError, match=r"Bad\.table: .*cli=False"):
        add_config_options(argparse.ArgumentParser(), bad)
