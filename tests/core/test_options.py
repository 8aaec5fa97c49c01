"""Every build option is declared once (BuildConfig) and the CLI is generated from it."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import pytest

from pipeline.accuracy.gates import Gates
from pipeline.build.config import BuildConfig
from pipeline.cli import make_parser
from pipeline.commands.deploy import DeployConfig
from pipeline.commands.mig_plan import MigPlanConfig
from pipeline.commands.serve import ServeConfig
from pipeline.commands.verify import VerifyConfig
from pipeline.core.errors import PipelineError
from pipeline.core.options import as_mapping, config_from_values, fields_of, values_from_mapping


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize(("command", "cls"), [
    ("build", BuildConfig), ("verify", VerifyConfig), ("serve", ServeConfig), ("deploy", DeployConfig), ("mig-plan", MigPlanConfig),
])  # fmt: skip
def test_every_cli_option_has_a_config_field_with_default_and_help_and_the_reverse(command: str, cls: type) -> None:
    parser = _subparser(command)
    # help, and the config-file switches every command has (pipeline/commands/configfile.py), are not settings
    flags = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in ("help", "config", "print_config")}
    fields = {f.name: f for f in fields_of(cls)}
    assert set(flags) == set(fields), f"CLI-only: {set(flags) - set(fields)}, config-only: {set(fields) - set(flags)}"
    for name, fld in fields.items():
        assert fld.default is not dataclasses.MISSING, name
        assert flags[name].help and len(flags[name].help) > 10, name
        assert fld.flag in flags[name].option_strings


def test_config_fields_without_option_are_only_the_recorded_command() -> None:
    names = {f.name for f in dataclasses.fields(BuildConfig)} - {f.name for f in fields_of(BuildConfig)}
    # gates is a nested option dataclass, command is recorded, not set; tensorrt is the seam a caller without TensorRT replaces
    assert names == {"gates", "command", "tensorrt"}


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


def test_commands_share_one_declaration_of_repository_and_ports() -> None:
    shared = {name: {f.name: f.option for f in fields_of(cls)} for name, cls in
              (("serve", ServeConfig), ("verify", VerifyConfig), ("build", BuildConfig), ("deploy", DeployConfig))}  # fmt: skip
    assert shared["serve"]["repository"] == shared["verify"]["repository"] == dataclasses.replace(shared["build"]["repository"], group=None)
    assert shared["deploy"]["repository"] == shared["serve"]["repository"]
    for port in ("http_port", "grpc_port", "metrics_port"):
        assert "0 = any free port" in shared["serve"][port].help  # serve binds any free port on 0 ...
        assert "0 = any free port" not in shared["deploy"][port].help  # ... a container's published port must be named


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--slices", "0"], r"--slices 0 is below 1 — use --slices 1 for one server"),
        (["serve", "--http-port", "70000"], r"--http-port 70000 is out of range \(0 to 65535, 0 = any free port\)"),
        (["serve", "--timeout", "0"], r"--timeout 0.0 is not a positive number of seconds"),
        (["serve", "--timeout", "nan"], r"--timeout nan is not a positive number of seconds"),
        (["deploy", "--grpc-port", "0"], r"--grpc-port 0 is out of range \(1 to 65535\)"),
        (["mig-plan", "--gpu", "H200-141GB", "--onnx", "{tmp}/m.onnx", "--max-batch", "0"], r"--max-batch 0 is below 1 — pass a batch size"),
        (["mig-plan", "--gpu", "H200-141GB", "--bundle", "{tmp}/b", "--max-gpus", "0"], r"--max-gpus 0 is below 1 — use 1 or more"),
    ],
)
def test_bad_values_of_the_other_commands_are_one_line_exit_2_before_anything_runs(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import re

    from pipeline.cli import main

    outputs = {"serve": ["--workdir", "{tmp}/w"], "deploy": ["--out", "{tmp}/d"], "mig-plan": []}[argv[0]]
    assert main([a.format(tmp=tmp_path) for a in [*argv, *outputs, "--repository", "{tmp}/r"]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert re.search(message, err[0]), err[0]
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def test_a_config_file_reaches_the_typed_serve_and_mig_plan_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib

    from pipeline.cli import main

    config = tmp_path / "pipeline.toml"
    config.write_text('[serve]\nslices = 2\nmodel-control = "explicit"\nrestricted-api = true\n\n'
                      '[mig-plan]\nfrom-tune = ["a", "b"]\nmax-gpus = 2\n')
    assert main(["serve", "--config", str(config), "--grpc-port", "0", "--print-config"]) == 0
    serve = tomllib.loads(capsys.readouterr().out)["serve"]
    assert (serve["slices"], serve["model-control"], serve["restricted-api"], serve["grpc-port"], serve["http-port"]) == (2, "explicit", True, 0, 8000)
    assert main(["mig-plan", "--config", str(config), "--from-tune", "c", "--print-config"]) == 0
    mig = tomllib.loads(capsys.readouterr().out)["mig-plan"]
    assert (mig["from-tune"], mig["max-gpus"], mig["from-nvidia-smi"]) == (["c"], 2, [])  # a flag's list replaces the file's
    config.write_text('[serve]\nslices = "2"\n')
    assert main(["serve", "--config", str(config)]) == 2
    assert "'slices' in " in capsys.readouterr().err


@pytest.mark.parametrize("command", ["serve", "deploy", "mig-plan", "verify"])
def test_print_config_of_the_typed_commands_reads_back(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import main

    assert main([command, "--repository", str(tmp_path / "repo"), "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert f'repository = "{tmp_path / "repo"}"' in printed
    (tmp_path / "again.toml").write_text(printed)
    assert main([command, "--config", str(tmp_path / "again.toml"), "--print-config"]) == 0
    assert capsys.readouterr().out == printed
