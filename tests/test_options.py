"""Every build option is declared once (BuildConfig) and the CLI is generated from it."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import pytest

from pipeline.cli import make_parser
from pipeline.config import BuildConfig
from pipeline.errors import PipelineError
from pipeline.gates import Gates
from pipeline.options import as_mapping, config_from_values, fields_of, values_from_mapping
from pipeline.triton.verify_cli import VerifyConfig


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize(("command", "cls"), [("build", BuildConfig), ("verify", VerifyConfig)])
def test_every_cli_option_has_a_config_field_with_default_and_help_and_the_reverse(command: str, cls: type) -> None:
    parser = _subparser(command)
    # help, and the config-file switches every command has (pipeline/configfile.py), are not settings
    flags = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in ("help", "config", "print_config")}
    fields = {f.name: f for f in fields_of(cls)}
    assert set(flags) == set(fields), f"CLI-only: {set(flags) - set(fields)}, config-only: {set(fields) - set(flags)}"
    for name, fld in fields.items():
        assert fld.default is not dataclasses.MISSING, name
        assert flags[name].help and len(flags[name].help) > 10, name
        assert fld.flag in flags[name].option_strings


def test_config_fields_without_option_are_only_the_recorded_command() -> None:
    names = {f.name for f in dataclasses.fields(BuildConfig)} - {f.name for f in fields_of(BuildConfig)}
    assert names == {"gates", "command"}  # gates is a nested option dataclass, command is recorded, not set


def test_flags_reach_the_typed_config_and_nested_gates() -> None:
    args = make_parser().parse_args(["build", "--int8", "--fp16-max-drop", "0.5", "--shape", "a:1/2/3", "--shape", "b:1/1/1", "--no-engine"])
    cfg = config_from_values(BuildConfig, {k: v for k, v in vars(args).items() if k in {f.name for f in fields_of(BuildConfig)}})
    assert cfg.int8 and not cfg.fp16 and not cfg.engine
    assert cfg.shapes == ("a:1/2/3", "b:1/1/1")
    assert cfg.gates == dataclasses.replace(Gates(), fp16_max_drop=0.5)
    assert cfg.workdir == Path("build")  # untouched options keep the dataclass default


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--int8-max-drop", "nan"], "--int8-max-drop nan is not a finite number"),
        (["--fp16-atol", "-1"], "--fp16-atol -1.0 is negative"),
        (["--parity-rtol", "-0.5"], "--parity-rtol -0.5 is negative"),
        (["--max-batch", "0"], "--max-batch 0 is out of range"),
        (["--opset", "13"], "--opset 13 is too old"),
        (["--gate-confidence", "1.5"], "--gate-confidence 1.5 is out of range"),
    ],
)
def test_bad_option_values_are_one_line_errors(argv: list[str], message: str) -> None:
    args = make_parser().parse_args(["build", *argv])
    cfg = config_from_values(BuildConfig, {k: v for k, v in vars(args).items() if k in {f.name for f in fields_of(BuildConfig)}})
    with pytest.raises(PipelineError, match=message.replace("-", r"\-").replace(".", r"\.")):
        cfg.validate()


def test_config_file_values_use_flag_names_and_are_type_checked() -> None:
    values = values_from_mapping(BuildConfig, {"max-batch": 8, "int8": True, "shape": ["x:1/2/3"], "int8_max_drop": 2}, "pipeline.toml")
    cfg = config_from_values(BuildConfig, values)
    assert (cfg.max_batch, cfg.int8, cfg.shapes, cfg.gates.int8_max_drop) == (8, True, ("x:1/2/3",), 2.0)
    with pytest.raises(PipelineError, match="unknown key 'max-btach' in pipeline.toml — did you mean 'max-batch'"):
        values_from_mapping(BuildConfig, {"max-btach": 8}, "pipeline.toml")
    with pytest.raises(PipelineError, match="'max-batch' in pipeline.toml must be an integer"):
        values_from_mapping(BuildConfig, {"max-batch": "8"}, "pipeline.toml")
    with pytest.raises(PipelineError, match="'int8' in pipeline.toml must be true or false"):
        values_from_mapping(BuildConfig, {"int8": 1}, "pipeline.toml")


def test_effective_config_reads_back() -> None:
    cfg = dataclasses.replace(BuildConfig(), max_batch=16)
    mapping = {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in as_mapping(cfg).items() if v is not None}
    again = config_from_values(BuildConfig, values_from_mapping(BuildConfig, mapping, "x"))
    assert dataclasses.replace(again, command=cfg.command) == cfg
    assert not math.isnan(again.gates.fp16_max_drop)
