"""``--config FILE`` (TOML) and ``--print-config`` for every command.

A config file has one table per command, its keys named like the command's flags without the
leading dashes (``max-batch`` or ``max_batch``; ``engine = false`` for ``--no-engine``)::

    [build]
    fp16 = true
    int8 = true
    max-batch = 32

    [loadtest]
    concurrency = "1,4,16"
    slo-p99-ms = 5.0

Precedence: built-in defaults < the file < flags on the command line. A command whose options are
declared as a typed dataclass (:mod:`pipeline.core.options`) reads its table through that declaration;
the other commands are checked against their argparse flags (type, choices, on/off switches). An
unknown table or key, a value of the wrong type, or a file that is not TOML is one line, exit 2.
``--print-config`` prints the effective settings as such a table and runs nothing.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError

_NOT_CONFIGURABLE = {"help", "config", "print_config", "version"}


def add_config_options(subparsers: argparse._SubParsersAction) -> None:
    """Give every registered command ``--config FILE`` and ``--print-config``."""
    for parser in subparsers.choices.values():
        group = parser.add_argument_group("config file")
        group.add_argument("--config", type=Path, metavar="FILE",
                           help="read settings from the [<command>] table of this TOML file; flags override it")  # fmt: skip
        group.add_argument("--print-config", action="store_true", help="print the effective settings as TOML and exit")


def load_config_defaults(subparsers: argparse._SubParsersAction, argv: Sequence[str]) -> None:
    """If ``argv`` names ``--config FILE``, make the file's values the command's defaults (before parsing)."""
    command = next((a for a in argv if a in subparsers.choices), None)
    path = _config_path(argv)
    if command is None or path is None:
        return
    parser = subparsers.choices[command]
    table = _read_table(path, command, list(subparsers.choices))
    where = f"{path} [{command}]"
    cls = parser.get_default("options_class")
    if cls is not None:
        from pipeline.core.options import values_from_mapping

        values = {name: list(v) if isinstance(v, tuple) else v for name, v in values_from_mapping(cls, table, where).items()}
    else:
        values = _values_for_parser(parser, table, where)
    for action in parser._actions:  # argparse keeps its actions there; set_defaults alone cannot lift `required`
        if action.dest in values:
            action.required = False
    parser.set_defaults(**values)
    parser.set_defaults(config_file_lists={d: len(v) for d, v in values.items() if isinstance(v, list)})


def finish(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str]) -> None:
    """After parsing: a list option given on the command line replaces the file's list instead of extending it."""
    lists: dict[str, int] = getattr(args, "config_file_lists", None) or {}
    sub = _command_parser(parser, args)
    for action in sub._actions:
        if action.dest in lists and _given(action, argv):
            setattr(args, action.dest, getattr(args, action.dest)[lists[action.dest]:])


def effective_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The settings the command would run with, as a TOML table."""
    cls = getattr(args, "options_class", None)
    if cls is not None:
        from pipeline.core.options import as_mapping, config_from_values, values_from_namespace

        mapping = as_mapping(config_from_values(cls, values_from_namespace(cls, args)))
    else:
        sub = _command_parser(parser, args)
        mapping = {a.dest.replace("_", "-"): getattr(args, a.dest, None) for a in sub._actions
                   if a.dest not in _NOT_CONFIGURABLE and a.option_strings}  # fmt: skip
    lines = [f"[{args.command}]"]
    for key, value in mapping.items():
        lines.append(f"# {key} is not set" if value is None else f"{key} = {_toml(value)}")
    return "\n".join(lines) + "\n"


# -- reading -----------------------------------------------------------------------------------------


def _config_path(argv: Sequence[str]) -> Path | None:
    for i, arg in enumerate(argv):
        if arg == "--config":
            if i + 1 >= len(argv):
                raise PipelineError("--config needs a file", "e.g. --config pipeline.toml")
            return Path(argv[i + 1])
        if arg.startswith("--config="):
            return Path(arg.split("=", 1)[1])
    return None


def _read_table(path: Path, command: str, commands: list[str]) -> dict[str, Any]:
    try:
        document = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"config file {path} does not exist", "pass the path of a TOML file to --config") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PipelineError(f"cannot read config file {path} ({exc})", "pass a readable TOML file to --config") from None
    except tomllib.TOMLDecodeError as exc:
        raise PipelineError(f"config file {path} is not TOML ({exc})", "fix the syntax; see the example pipeline.toml in the README") from None
    for key, value in document.items():
        if key not in commands or not isinstance(value, dict):
            close = difflib.get_close_matches(key, commands, n=1)
            hint = f"did you mean [{close[0]}]?" if close else f"use tables named after commands: {', '.join(f'[{c}]' for c in commands)}"
            raise PipelineError(f"'{key}' in {path} is not a command table", hint)
    return document.get(command, {})


def _values_for_parser(parser: argparse.ArgumentParser, table: dict[str, Any], where: str) -> dict[str, Any]:
    """Check a table against the parser's own flags and convert it with their types."""
    by_key: dict[str, tuple[argparse.Action, bool]] = {}
    for action in parser._actions:
        if action.dest in _NOT_CONFIGURABLE or not action.option_strings:
            continue
        by_key[action.dest.replace("_", "-")] = (action, False)
        for flag in action.option_strings:
            by_key.setdefault(flag.lstrip("-"), (action, True))
    values: dict[str, Any] = {}
    for key, value in table.items():
        found = by_key.get(key.replace("_", "-"))
        if found is None:
            close = difflib.get_close_matches(key.replace("_", "-"), list(by_key), n=1)
            raise PipelineError(f"unknown key '{key}' in {where}", f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(by_key))}")
        action, by_flag = found
        values[action.dest] = _convert(action, key, value, where, by_flag)
    return values


def _convert(action: argparse.Action, key: str, value: Any, where: str, by_flag: bool) -> Any:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise PipelineError(f"'{key}' in {where} must be true or false, got {value!r}", f"fix '{key}' in {where}")
        return (not value) if by_flag and isinstance(action, argparse._StoreFalseAction) else value
    if action.nargs == 0:
        raise PipelineError(f"'{key}' cannot be set in a config file", f"remove it from {where}")
    if isinstance(action, argparse._AppendAction):
        return [_scalar(action, key, v, where) for v in (value if isinstance(value, list) else [value])]
    return _scalar(action, key, value, where)


def _scalar(action: argparse.Action, key: str, value: Any, where: str) -> Any:
    """A TOML value through the flag's own type; strings stay strings and numbers numbers."""
    if isinstance(value, (bool, list, dict)) or (isinstance(value, float) and not math.isfinite(value)):
        raise PipelineError(f"'{key}' in {where} must be a single {_kind(action)}, got {value!r}", f"fix '{key}' in {where}")
    convert = action.type or str
    try:
        converted = convert(str(value)) if callable(convert) else str(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        raise PipelineError(f"'{key}' in {where} is not valid: {exc}", f"fix '{key}' in {where}") from None
    numeric = isinstance(converted, (int, float)) and not isinstance(converted, bool)
    if numeric != isinstance(value, (int, float)):
        raise PipelineError(f"'{key}' in {where} must be {'a number' if numeric else 'a string'}, got {value!r}", f"fix '{key}' in {where}")
    if action.choices is not None and converted not in action.choices:
        raise PipelineError(f"'{key}' in {where} is {value!r}, not one of {', '.join(map(str, action.choices))}", f"fix '{key}' in {where}")
    return converted


def _kind(action: argparse.Action) -> str:
    return "number" if action.type in (int, float) else "value"


# -- helpers ---------------------------------------------------------------------------------------------


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[args.command]
    raise AssertionError("the parser has no commands")


def _given(action: argparse.Action, argv: Sequence[str]) -> bool:
    return any(a in action.option_strings or a.split("=", 1)[0] in action.option_strings for a in argv)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if math.isfinite(value) else ("nan" if value != value else ("inf" if value > 0 else "-inf"))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)
