"""The docs cannot drift from the code: the command blocks the docs mark as runnable on a CPU run
here, and every command and `--option` the docs name exists in the CLI (docs/design.md, "Commands
in the docs", describes the marker).

A marked block is a fenced ```bash block right below a line ``<!-- run: cpu[, FLAG...] -->``; FLAGs:
``slow`` (it builds a model), ``built`` (it runs where the bundled model was built, as
``python -m pipeline build --fp16 --int8`` leaves the folder: ``build/``, ``model_repository/``,
``deploy/``; slow, since it needs that build) and ``exit=N`` (every command of the block exits N
instead of 0). Each command is ``python ...`` or ``.venv/bin/python ...``, optionally ending in
``> FILE``, run with this Python in a fresh temporary folder; a block's commands run in order there."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, Built

_MARKED = re.compile(r"^<!-- run: cpu(?P<flags>[^>]*?)\s*-->\n```bash\n(?P<body>.*?)^```", re.M | re.S)
_FLAGS = re.compile(r"^(slow|built|exit=\d+)$")
_PYTHONS = ("python", ".venv/bin/python")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    """One marked command block: where it is, its flags, and its commands (argv lists)."""

    where: str
    flags: frozenset[str]
    commands: tuple[tuple[str, ...], ...]

    @property
    def exit_status(self) -> int:
        return next((int(flag.split("=")[1]) for flag in self.flags if flag.startswith("exit=")), 0)


def _commands(body: str) -> tuple[tuple[str, ...], ...]:
    joined = re.sub(r"\\\n", " ", body)
    return tuple(tuple(argv) for argv in (shlex.split(line, comments=True) for line in joined.splitlines()) if argv)


def marked_blocks() -> list[Block]:
    """Every marked block of README.md and docs/, in page order."""
    blocks = []
    for page in _pages():
        text = page.read_text()
        for match in _MARKED.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            flags = frozenset(flag.strip() for flag in match["flags"].split(",") if flag.strip())
            blocks.append(Block(f"{page.relative_to(ROOT)}:{line}", flags, _commands(match["body"])))
    return blocks


_BLOCKS = marked_blocks()


def _param(block: Block) -> object:
    marks = [pytest.mark.slow] if {"slow", "built"} & block.flags else []
    return pytest.param(block, id=block.where, marks=marks)


def test_marked_blocks_are_well_formed() -> None:
    """The marker is found (a typo would silently run nothing), its flags are known, and every
    command is a Python command this test can run with the suite's interpreter."""
    every_marker = sum(len(re.findall(r"^<!-- run:", page.read_text(), re.M)) for page in _pages())
    assert every_marker == len(_BLOCKS) > 0, "a '<!-- run:' marker is not right above a ```bash block, or is misspelled"
    for block in _BLOCKS:
        assert all(_FLAGS.match(flag) for flag in block.flags), (block.where, block.flags)
        assert block.commands, block.where
        assert all(argv[0] in _PYTHONS for argv in block.commands), (block.where, block.commands)


@pytest.fixture
def workdir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A fresh folder; for a ``built`` block, holding a copy of the session's bundled-model build."""
    block: Block = request.node.callspec.params["block"]
    if "built" in block.flags:
        built: Built = request.getfixturevalue("built")
        shutil.copytree(built.workdir, tmp_path / "build", symlinks=True)
        shutil.copytree(built.repository, tmp_path / "model_repository", symlinks=True)
        shutil.copytree(built.deploy, tmp_path / "deploy", symlinks=True)
    return tmp_path


@pytest.mark.parametrize("block", [_param(block) for block in _BLOCKS])
def test_marked_block_runs(block: Block, workdir: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), COLUMNS="200")
    for argv in block.commands:
        argv, into = (argv[:-2], argv[-1]) if len(argv) > 2 and argv[-2] == ">" else (argv, None)  # `... > FILE`
        ran = subprocess.run([sys.executable, *argv[1:]], cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
        assert ran.returncode == block.exit_status, (block.where, argv, ran.returncode, ran.stdout[-2000:], ran.stderr[-3000:])
        assert "Traceback" not in ran.stderr, (block.where, argv, ran.stderr[-3000:])
        if into is not None:
            (workdir / into).write_text(ran.stdout)


# --- every command and option the docs name exists --------------------------------------------------

# Options the docs name that belong to other tools, with the tool (a pipeline option is never listed).
FOREIGN_OPTIONS = {
    "--heavy": "pytest (tests/conftest.py)", "--random-order-bucket": "pytest-random-order",
    "--random-order-seed": "pytest-random-order", "--durations": "pytest",
    "--extra-index-url": "pip", "--stronglyTyped": "trtexec", "--dumpLayerInfo": "trtexec", "--strict": "mkdocs build",
    "--onnx-outputs": "polygraphy run", "--model-control-mode": "tritonserver", "--load-model": "tritonserver", "--model-repository": "tritonserver",
    "--http-restricted-api": "tritonserver", "--grpc-restricted-protocol": "tritonserver",
    "--init": "docker run", "--gpus": "docker run", "--from-literal": "kubectl create secret",
    "--models": "scripts/bench_build.py, scripts/bench_int8_cpu.py", "--repeats": "scripts/bench_*.py",
    "--pin": "scripts/bench_*.py", "--server-cores": "scripts/bench_workers.py",
    "--phase": "scripts/bench_gpu.py", "--from-json": "scripts/zoo_table.py", "--query-gpu": "nvidia-smi",
    "--field-name": "a placeholder in docs/design.md: the flag of a BuildConfig field",
    "--attention": "scripts/bench_zoo_hub.py", "--no-deps": "pip",
    "--front-end": "scripts/bench_served.py", "--rounds": "scripts/bench_int8_cpu.py", "--transports": "scripts/bench_int8_cpu.py",
    "--module": "scripts/mutation.py", "--survivors": "scripts/mutation.py", "--report-only": "scripts/mutation.py",
    "--convert-to": "polygraphy convert", "--strongly-typed": "polygraphy convert", "--trt-min-shapes": "polygraphy convert",
    "--trt-opt-shapes": "polygraphy convert", "--trt-max-shapes": "polygraphy convert", "--model-type": "polygraphy run",
    "--trt": "polygraphy run", "--optimization-profile": "polygraphy run", "--load-inputs": "polygraphy run",
    "--load-outputs": "polygraphy run", "--model-repository": "tritonserver",
    "--exit-on-error": "tritonserver", "--strict-readiness": "tritonserver", "--no-index": "pip",
    "--large_model": "python -m tf2onnx.convert", "--sizes": "scripts/bench_build.py",
    "--rates": "scripts/bench_mlperf.py", "--seconds": "scripts/bench_mlperf.py", "--find-max": "scripts/bench_mlperf.py",
    "--bound-ms": "scripts/bench_mlperf.py",
}
_OPTION = re.compile(r"(?<![\w-])--[A-Za-z][\w{},-]*")
_CODE = re.compile(r"```[^\n]*\n(.*?)```|`([^`\n]+)`", re.S)


def _parsers() -> dict[str, set[str]]:
    from pipeline.cli import make_parser

    parser = make_parser()
    sub = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    top = {option for action in parser._actions for option in action.option_strings}
    return {name: top | {option for action in command._actions for option in action.option_strings}
            for name, command in sub.choices.items()}


def _expand(option: str) -> list[str]:
    """``--{fp16,int8}-max-drop`` names two options."""
    braces = re.search(r"\{([^}]*)\}", option)
    if not braces:
        return [option.rstrip(",-")]
    return [expanded for part in braces[1].split(",") for expanded in _expand(option[:braces.start()] + part + option[braces.end():])]


def _code_lines() -> list[tuple[str, str]]:
    """(page, line) for every line of code, fenced or inline, in README.md and docs/."""
    found = []
    for page in _pages():
        for match in _CODE.finditer(page.read_text()):
            text = match[1] if match[1] is not None else match[2]
            found.extend((str(page.relative_to(ROOT)), line) for line in text.splitlines())
    return found


def _invocation(line: str, commands: set[str]) -> tuple[str, list[str]] | None:
    """The pipeline command a code line runs, and the words after it: `python -m pipeline X ...`, or a
    line that starts with a command name (`loadtest --merge PATH`)."""
    words = line.split("#")[0].split()
    for i, word in enumerate(words[:-1]):
        if word == "-m" and words[i + 1] == "pipeline":
            rest = [w for w in words[i + 2:] if w not in ("-v", "--verbose")]
            return (rest[0], rest[1:]) if rest else ("", [])
    if words and words[0] in commands and len(words) > 1 and words[1].startswith("--"):
        return words[0], words[1:]
    return None


def test_every_command_and_option_in_the_docs_exists() -> None:
    parsers = _parsers()
    every_option = set().union(*parsers.values())
    wrong = []
    for page, line in _code_lines():
        called = _invocation(line, set(parsers))
        options = [expanded for option in _OPTION.findall(line) for expanded in _expand(option)]
        if called is not None:
            command, rest = called
            if command and command not in parsers and not command.startswith("-"):
                wrong.append((page, line, f"no command {command!r}"))
                continue
            own = [expanded for word in rest for option in _OPTION.findall(word.split("=")[0]) for expanded in _expand(option)]
            wrong.extend((page, line, f"{command} has no {option}") for option in own
                         if option not in parsers.get(command, every_option) and option not in FOREIGN_OPTIONS)
        else:
            wrong.extend((page, line, f"no pipeline command has {option}") for option in options
                         if option not in every_option and option not in FOREIGN_OPTIONS)
    for page in _pages():  # prose too: an option named outside code
        for line in page.read_text().splitlines():
            wrong.extend((str(page.relative_to(ROOT)), line, f"no pipeline command has {expanded}") for option in _OPTION.findall(line)
                         for expanded in _expand(option) if expanded not in every_option and expanded not in FOREIGN_OPTIONS)
    assert not wrong, "\n".join(sorted({f"{page}: {problem}: {line.strip()}" for page, line, problem in wrong}))


def test_foreign_options_are_not_pipeline_options() -> None:
    """The exceptions above stay exceptions: none of them is (or becomes) an option of a command."""
    every_option = set().union(*_parsers().values())
    assert not every_option & set(FOREIGN_OPTIONS)
