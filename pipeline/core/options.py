"""Typed options: each option is declared once, as a dataclass field, and everything else reads it.

A command's settings are a frozen dataclass whose fields carry an :class:`Option` in their metadata
(``field = option(default, "help")``). From that one declaration come the command-line flag (its
type, choices, metavar, help and default), the value check, and the reading of a TOML config file
with the same names as the flags. Options shared by several commands (``--repository``,
``--calibration-root``, ports, ``--slo-p99-ms``) are declared once below and reused.

Adding an option: add a field with ``option(...)`` to the command's config dataclass and use it in
the stage that needs it. Nothing else: the flag, its help, the config-file key and the checks follow.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pipeline.core.errors import PipelineError
from pipeline.core.objectstore import S3Url, repository_from_text

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")  # an options dataclass
Check = Callable[[Any], "str | None"]  # returns why a value is wrong, or None


@dataclass(frozen=True)
class Option:
    """How a config field appears to users: flag, help, choices and its check."""

    help: str
    flag: str | None = None  # default: "--" + the field name with "-" for "_"
    metavar: str | None = None
    choices: tuple[Any, ...] | None = None
    check: Check | None = None
    fix: str | None = None  # what to do when the check fails
    group: str | None = None
    parse: Callable[[str], Any] | None = None  # text (flag or file) -> value, when the field's type cannot parse it itself


def option(default: Any = MISSING, help: str = "", *, default_factory: Any = MISSING, **how: Any) -> Any:
    """A dataclass field that is also a user option (see the module docstring)."""
    meta = {"option": Option(help, **how)}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


# ---- checks --------------------------------------------------------------------------------------


def non_negative(value: float | None) -> str | None:
    """A finite number ≥ 0 (NaN and infinities are refused: a NaN tolerance passes everything)."""
    if value is None:
        return None
    if not math.isfinite(value):
        return "is not a finite number"
    return "is negative" if value < 0 else None


def in_range(low: float, high: float) -> Check:
    """A number in [low, high]."""

    def check(value: float | None) -> str | None:
        if value is None:
            return None
        if not math.isfinite(value) or not low <= value <= high:
            return f"is out of range ({low:g} to {high:g})"
        return None

    return check


def at_least(low: int) -> Check:
    """A count of at least ``low`` (``--slices``, ``--max-batch``, ...); None means unset."""

    def check(value: int | None) -> str | None:
        return None if value is None or value >= low else f"is below {low}"

    return check


def port_number(value: int) -> str | None:
    """A TCP port, 0 meaning any free port."""
    return None if 0 <= value <= 65535 else "is out of range (0 to 65535, 0 = any free port)"


def fixed_port_number(value: int) -> str | None:
    """A TCP port that must be named (a container's published port cannot be "any free port")."""
    return None if 1 <= value <= 65535 else "is out of range (1 to 65535)"


# ---- options shared by several commands ------------------------------------------------------------


DEFAULT_REPOSITORY = Path("model_repository")
REPOSITORY_HELP = "Triton model repository: a folder, or s3://BUCKET/PREFIX (credentials and endpoint from the AWS environment)"


def repository_option(group: str | None = None) -> Any:
    """``--repository``: the Triton model repository, a folder or an ``s3://`` URL (a field typed ``Path | S3Url``)."""
    return option(DEFAULT_REPOSITORY, REPOSITORY_HELP, metavar="DIR|URL", parse=repository_from_text, group=group)


def repository_arg(text: str) -> Path | S3Url:
    """``--repository`` for a command that declares its flags with argparse (``type=repository_arg``)."""
    try:
        return repository_from_text(text)
    except PipelineError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


CALIBRATION_ROOT = Path("calibration")  # --calibration-root default, relative to the current directory

def calibration_root_option(group: str | None = None) -> Any:
    """``--calibration-root``: where ``<model>/{eval.npz,calib.npz,labels.txt}`` live."""
    return option(CALIBRATION_ROOT, "where per-model data folders <model>/{eval.npz,calib.npz,labels.txt} live", metavar="DIR", group=group)


def eval_data_option(group: str | None = None) -> Any:
    """``--eval-data``: labeled evaluation data for one model."""
    return option(None, "labeled evaluation data: an .npz with one array per input name plus 'labels' "
                        "(default: what the build recorded, else <calibration-root>/<model>/eval.npz)", metavar="NPZ", group=group)


def port_option(default: int, what: str, published: bool = False) -> Any:
    """``--http-port``/``--grpc-port``/``--metrics-port``; a ``published`` container port is the same number on
    the host and inside, so it must be named (0, any free port, cannot work there)."""
    if published:
        return option(default, f"{what} port, the same on the host and in the container", metavar="PORT", check=fixed_port_number)
    return option(default, f"{what} port, 0 = any free port", metavar="PORT", check=port_number)


def slo_option(required: bool = False) -> Any:
    """``--slo-p99-ms``: the client p99 latency objective."""
    return option(None, "client p99 latency objective in milliseconds" + (" (required)" if required else ""),
                  metavar="MS", check=lambda v: None if v is None or (math.isfinite(v) and v > 0) else "must be a positive number")


# ---- reading the declarations ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Field:
    name: str
    type: Any  # the resolved annotation with None stripped
    optional: bool
    default: Any
    option: Option
    owner: type

    @property
    def flag(self) -> str:
        return self.option.flag or "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        """The config-file key: the flag without its dashes (``--shape`` → ``shape``); a negated switch
        (``--no-engine``) is keyed by what it switches (``engine = false``)."""
        if self.type is bool and self.default is True:
            return self.name.replace("_", "-")
        return self.flag.lstrip("-")


def _resolved(cls: type) -> dict[str, Any]:
    import sys

    module = sys.modules[cls.__module__]
    return typing.get_type_hints(cls, vars(module))


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def nested(cls: type) -> dict[str, type]:
    """Fields of ``cls`` that are option dataclasses themselves (e.g. ``gates``), by name."""
    hints = _resolved(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name]) and "option" not in f.metadata}


def fields_of(cls: type) -> Iterator[_Field]:
    """Every option of ``cls``, nested option dataclasses included (their names are unique)."""
    hints = _resolved(cls)
    for f in dataclasses.fields(cls):
        if f.name in nested(cls):
            yield from fields_of(hints[f.name])
        elif "option" in f.metadata:
            tp, optional = _strip_optional(hints[f.name])
            default = f.default if f.default is not MISSING else (f.default_factory() if f.default_factory is not MISSING else MISSING)
            yield _Field(f.name, tp, optional, default, f.metadata["option"], cls)


def _convert_scalar(tp: Any, text: str) -> Any:
    if tp is float:
        return float(text)
    return tp(text)


def _argparse_type(fld: _Field) -> Callable[[str], Any]:
    tp = typing.get_args(fld.type)[0] if typing.get_origin(fld.type) is tuple else fld.type

    def parse(text: str) -> Any:
        try:
            return fld.option.parse(text) if fld.option.parse else _convert_scalar(tp, text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {'a number' if tp in (int, float) else 'valid'}") from None
        except PipelineError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = getattr(tp, "__name__", "value")
    return parse


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """Register every option of ``cls`` on ``parser``, grouped by ``Option.group``.

    Defaults stay out of the namespace (``SUPPRESS``) so a config file can sit between the
    dataclass defaults and the flags; the help shows the dataclass default.
    """
    parser.set_defaults(options_class=cls)  # --config and --print-config read the options through it
    groups: dict[str, Any] = {}
    for fld in fields_of(cls):
        opt = fld.option
        target = parser
        if opt.group:
            target = groups.setdefault(opt.group, parser.add_argument_group(opt.group))
        hidden = fld.default is None or fld.default is MISSING or fld.default == () or fld.type is bool or "(default" in opt.help
        shown = "" if hidden else f" (default: {fld.default})"
        kwargs: dict[str, Any] = {"dest": fld.name, "default": argparse.SUPPRESS, "help": (opt.help + shown).replace("%", "%%")}
        if fld.type is bool and fld.default is None:  # unset, on or off: --x / --no-x
            kwargs["action"] = argparse.BooleanOptionalAction
        elif fld.type is bool:
            kwargs["action"] = "store_false" if fld.default else "store_true"
        elif typing.get_origin(fld.type) is tuple:
            kwargs.update(action="append", type=_argparse_type(fld), metavar=opt.metavar)
        else:
            kwargs.update(type=_argparse_type(fld), metavar=opt.metavar)
            if opt.choices:
                kwargs["choices"] = opt.choices
        target.add_argument(fld.flag, **kwargs)


def _from_file_value(fld: _Field, value: Any, where: str) -> Any:
    tp = fld.type
    wrong = PipelineError(f"'{fld.key}' in {where} must be {_type_word(fld)}, got {value!r}", f"fix '{fld.key}' in {where}")
    if tp is bool:
        if not isinstance(value, bool):
            raise wrong
        return value
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        values = value if isinstance(value, list) else [value]
        return tuple(_from_file_value(dataclasses.replace(fld, type=item), v, where) for v in values)
    if tp in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (tp is int and not isinstance(value, int)):
            raise wrong
        return tp(value)
    if not isinstance(value, str):
        raise wrong
    if fld.option.parse is None:
        return tp(value)
    try:
        return fld.option.parse(value)
    except PipelineError as exc:
        raise PipelineError(f"'{fld.key}' in {where}: {exc.problem}", exc.fix) from None


def _type_word(fld: _Field) -> str:
    tp = fld.type
    if typing.get_origin(tp) is tuple:
        return f"a list of {getattr(typing.get_args(tp)[0], '__name__', 'values')}"
    return {bool: "true or false", int: "an integer", float: "a number", Path: "a path string", str: "a string"}.get(tp, "a string")


def values_from_mapping(cls: type, mapping: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Field values from a config file's table: keys are flag names (``max-batch``; ``max_batch`` works too).

    Unknown keys and values of the wrong type raise PipelineError naming the key and the fix.
    """
    by_key = {f.name.replace("_", "-"): f for f in fields_of(cls)} | {f.key: f for f in fields_of(cls)}
    values = {}
    for key, value in mapping.items():
        fld = by_key.get(key.replace("_", "-"))
        if fld is None:
            close = difflib.get_close_matches(key.replace("_", "-"), list(by_key), n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(by_key))}"
            raise PipelineError(f"unknown key '{key}' in {where}", hint)
        values[fld.name] = _from_file_value(fld, value, where)
    return values


def config_from_values(cls: type[T], values: Mapping[str, Any]) -> T:
    """Build ``cls`` from flat field values (flags or file); unset fields keep their defaults."""
    kwargs: dict[str, Any] = {}
    hints = _resolved(cls)
    inner = nested(cls)
    for f in dataclasses.fields(cls):
        if f.name in inner:
            kwargs[f.name] = config_from_values(hints[f.name], values)
        elif f.name in values:
            value = values[f.name]
            kwargs[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**kwargs)


def check_options(config: Any) -> None:
    """Check every option value of ``config`` (choices and checks); raise PipelineError on the first bad one."""
    for fld in fields_of(type(config)):
        value = _value_of(config, fld)
        opt = fld.option
        if opt.choices and value is not None and value not in opt.choices:
            raise PipelineError(f"{fld.flag} '{value}' is not one of the choices", f"use one of: {', '.join(map(str, opt.choices))}")
        why = opt.check(value) if opt.check else None
        if why:
            raise PipelineError(f"{fld.flag} {value} {why}", opt.fix or f"pass a valid {fld.flag}")


def _value_of(config: Any, fld: _Field) -> Any:
    if isinstance(config, fld.owner):
        return getattr(config, fld.name)
    for name in nested(type(config)):
        try:
            return _value_of(getattr(config, name), fld)
        except AttributeError:
            continue
    raise AttributeError(fld.name)


def as_mapping(config: Any) -> dict[str, Any]:
    """The effective config as flag-named keys (what ``--print-config`` shows; reads back as a config file)."""
    return {fld.key: _value_of(config, fld) for fld in fields_of(type(config))}


def values_from_namespace(cls: type, namespace: argparse.Namespace) -> dict[str, Any]:
    """The option values given on the command line (defaults are left out: see :func:`add_options`)."""
    given = vars(namespace)
    return {fld.name: given[fld.name] for fld in fields_of(cls) if fld.name in given}


def checked_config(cls: type[T], namespace: argparse.Namespace) -> T:
    """The checked ``cls`` of a parsed command line (flags over config file over defaults)."""
    config = config_from_values(cls, values_from_namespace(cls, namespace))
    check_options(config)
    return config
