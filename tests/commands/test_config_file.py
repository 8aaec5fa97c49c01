"""`--config FILE` (TOML) and `--print-config`: file values under flags, one-line errors for bad files."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.commands.configfile import add_config_options, finish, load_config_defaults
from pipeline.core.errors import PipelineError

CONFIG = """
[build]
fp16 = true
max-batch = 32
engine = false
shape = ["image:1x8x8x1/16x8x8x1/32x8x8x1"]

[loadtest]
concurrency = "1,4"
slo_p99_ms = 5.0
url = ["127.0.0.1:8000", "127.0.0.1:8003"]

[serve]
http-port = 9000
"""


def effective(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--print-config"]) == 0
    out = capsys.readouterr().out
    [table] = tomllib.loads(out).values()
    return table


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(CONFIG)
    return path


def test_build_reads_its_table_and_flags_override(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = effective(capsys, "build", "--config", str(config), "--max-batch", "16", "--int8")
    assert table["max-batch"] == 16 and table["int8"] is True  # flags win
    assert table["fp16"] is True and table["engine"] is False and table["shape"] == ["image:1x8x8x1/16x8x8x1/32x8x8x1"]  # the file
    assert table["opset"] == 17  # the typed config's default


def test_print_config_output_reads_back_as_the_same_config(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--config", str(config), "--print-config"]) == 0
    printed = capsys.readouterr().out
    again = tmp_path / "again.toml"
    again.write_text(printed)
    assert main(["build", "--config", str(again), "--print-config"]) == 0
    assert capsys.readouterr().out == printed


def test_a_list_flag_replaces_the_files_list(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert effective(capsys, "loadtest", "--config", str(config))["url"] == ["127.0.0.1:8000", "127.0.0.1:8003"]
    table = effective(capsys, "loadtest", "--config", str(config), "--url", "10.0.0.5:8000")
    assert table["url"] == ["10.0.0.5:8000"] and table["concurrency"] == "1,4" and table["slo-p99-ms"] == 5.0


def test_serve_and_commands_without_a_table_keep_their_defaults(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert effective(capsys, "serve", "--config", str(config))["http-port"] == 9000
    assert effective(capsys, "mig-plan", "--config", str(config))["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3"


def test_the_file_is_used_when_the_command_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text(f'[report]\nworkdir = "{tmp_path / "from-file-build"}"\nreports = "{tmp_path / "from-file-reports"}"\n')
    assert main(["report", "--config", str(config)]) == 2
    assert "from-file-build/<name>/manifest.json" in capsys.readouterr().err
    assert main(["report", "--config", str(config), "--workdir", str(tmp_path / "from-flag")]) == 2
    err = capsys.readouterr().err
    assert "from-flag/<name>/manifest.json" in err and "from-file-reports" in err


def test_a_required_flag_can_come_from_the_file(tmp_path: Path) -> None:
    # `tune` requires --model and --slo-p99-ms; a file that gives them is enough.
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    tune = sub.add_parser("tune")
    tune.add_argument("--model", action="append", default=[], required=True)
    tune.add_argument("--slo-p99-ms", type=float, required=True)
    add_config_options(sub)
    config = tmp_path / "t.toml"
    config.write_text('[tune]\nmodel = ["digits_fp32"]\nslo-p99-ms = 4\n')
    argv = ["tune", "--config", str(config)]
    load_config_defaults(sub, argv)
    args = parser.parse_args(argv)
    finish(parser, args, argv)
    assert args.model == ["digits_fp32"] and args.slo_p99_ms == 4.0


@pytest.mark.parametrize(("text", "argv", "expected"), [
    ("[biuld]\nfp16 = true\n", ["build"], r"'biuld' in .* is not a command table — did you mean \[build\]\?"),
    ("[build]\nmax-btach = 8\n", ["build"], r"unknown key 'max-btach' in .*\[build\] — did you mean 'max-batch'\?"),
    ("[build]\nmax-batch = \"8\"\n", ["build"], r"'max-batch' in .*\[build\] must be an integer, got '8'"),
    ("[build]\nint8 = 1\n", ["build"], r"'int8' in .*\[build\] must be true or false"),
    ("[build\n", ["build"], r"config file .* is not TOML \(.*line 1"),
    ("fp16 = true\n", ["build"], r"'fp16' in .* is not a command table"),
    ("[serve]\nhttp-port = \"8000\"\n", ["serve"], r"'http-port' in .*\[serve\] must be an integer, got '8000'"),
    ("[serve]\nhttp-port = 99999\n", ["serve"], r"--http-port 99999 is out of range \(0 to 65535"),  # checked with the flags' checks
    ("[loadtest]\nprotocol = \"udp\"\n", ["loadtest"], r"'protocol' in .*\[loadtest\] is 'udp', not one of http, grpc"),
    ("[loadtest]\nconcurrency = [1, 2]\n", ["loadtest"], r"'concurrency' in .*\[loadtest\] must be a single value"),
    ("[loadtest]\nhelp = true\n", ["loadtest"], r"unknown key 'help'"),
])  # fmt: skip
def test_bad_config_files_are_one_line_exit_2_and_nothing_runs(
    text: str, argv: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(text)
    assert main([*argv, "--config", str(config), "--workdir" if argv == ["build"] else "--repository", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert __import__("re").search(expected, err[0]), err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]  # nothing written


def test_a_missing_config_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"config file .*nope\.toml does not exist"):
        load_config_defaults(_subparsers(), ["build", "--config", str(tmp_path / "nope.toml")])


def _subparsers() -> argparse._SubParsersAction:
    from pipeline.cli import make_parser

    parser = make_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_the_docs_example_is_a_valid_config_for_every_command_it_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import ROOT

    page = (ROOT / "docs" / "guide" / "config.md").read_text()
    example = page.split("```toml\n", 1)[1].split("```", 1)[0]
    config = tmp_path / "pipeline.toml"
    config.write_text(example)
    tables = tomllib.loads(example)
    assert {"build", "loadtest"} <= set(tables)
    for command, table in tables.items():
        shown = effective(capsys, command, "--config", str(config))
        for key, value in table.items():
            expected = not value if key.startswith("no-") else value
            assert shown[key.removeprefix("no-")] == expected, (command, key)
