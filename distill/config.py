"""Stage configs of the distillation recipe: dataclasses loaded from a YAML preset and overridden on the command line.

A preset (``configs/distill/<name>.yaml``) is a mapping of sections, one per stage::

    predicates: {split: null}
    narrate:    {narrator: teacher, model: Qwen/Qwen3-32B, temperature: 0.7}
    sft:        {frames: 8, image_size: [336, 336]}
    train:      {model: Qwen/Qwen3-VL-8B-Instruct, learning_rate: 2.0e-5, num_train_epochs: 3}

A stage reads only its own section. Every field of the stage's dataclass is also a command-line option
``--<field> VALUE`` (``--field=VALUE`` works too); values are parsed as YAML scalars/lists (``--image_size '[336, 336]'``,
``--limit null``) and type-checked. Precedence: dataclass default < preset section < command line. Unknown keys in
the preset or on the command line are errors that name the file and the key. Each stage writes its resolved config
next to its outputs (`write_resolved`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from eval.io import FormatError, write_json

C = TypeVar("C")


def _field_help(f: dataclasses.Field) -> str:
    return str(f.metadata.get("help", ""))


def load_section(path: str | Path, section: str) -> dict[str, Any]:
    """The ``section`` mapping of a YAML preset (empty when the preset has no such section)."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise FormatError(path, "config file does not exist") from None
    except UnicodeDecodeError as e:
        raise FormatError(path, f"not valid UTF-8 ({e.reason})") from None
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        raise FormatError(path, f"not valid YAML ({e})", line=None if line is None else line + 1) from None
    if not isinstance(doc, dict):
        raise FormatError(path, f"expected a mapping of stage sections, got {type(doc).__name__}")
    value = doc.get(section) or {}
    if not isinstance(value, dict):
        raise FormatError(path, f"section must be a mapping, got {type(value).__name__}", field=section)
    return value


def _allowed(tp: Any) -> tuple[Any, ...]:
    """The runtime types a field annotation accepts (``None`` included for optional fields)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return tuple(t for a in typing.get_args(tp) for t in _allowed(a))
    if tp is type(None):
        return (type(None),)
    if origin in (list, tuple, Sequence):
        return (list, tuple)
    if origin is dict:
        return (dict,)
    if tp is float:
        return (float, int)
    return (origin or tp,)


def _coerce(cls: type, name: str, value: Any, where: str) -> Any:
    hints = typing.get_type_hints(cls)
    allowed = _allowed(hints[name])
    if isinstance(value, bool) and bool not in allowed:
        raise FormatError(where, f"expected {hints[name]}, got a boolean {value!r}", field=name)
    if not isinstance(value, allowed):
        raise FormatError(where, f"expected {hints[name]}, got {type(value).__name__} {value!r}", field=name)
    if isinstance(value, int) and not isinstance(value, bool) and float in allowed and int not in allowed:
        value = float(value)
    if isinstance(value, tuple):
        value = list(value)
    return value


def check(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    """Report unknown keys and mistyped values against ``where`` (a file or "command line"); returns the values with
    ints widened to floats where a float is wanted and tuples as lists."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise FormatError(where, f"unknown option(s) {unknown} for {cls.__name__}; known: {sorted(names)}")
    return {k: _coerce(cls, k, v, where) for k, v in values.items()}


def build(cls: type[C], values: dict[str, Any], where: str) -> C:
    """``cls(**values)`` after `check`; a missing required field is reported against ``where``."""
    kwargs = check(cls, values, where)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise FormatError(where, f"{cls.__name__}: {e}") from None
    except ValueError as e:  # a __post_init__ rejected a value
        raise FormatError(where, f"{cls.__name__}: {e}") from None


def argument_parser(cls: type, prog: str, description: str) -> argparse.ArgumentParser:
    """An argparse parser with ``--config`` plus one ``--<field>`` option per dataclass field (help from metadata)."""
    ap = argparse.ArgumentParser(prog=prog, description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML preset; this stage reads its own section of it")
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "(required)")
        ap.add_argument(f"--{f.name}", dest=f.name, default=argparse.SUPPRESS, metavar="VALUE",
                        help=f"{_field_help(f)} [default: {default}]".strip())
    return ap


def parse(cls: type[C], section: str, argv: Sequence[str] | None, *, prog: str, description: str) -> C:
    """Resolve a stage config: defaults < ``--config`` preset's ``section`` < ``--field VALUE`` options."""
    ap = argument_parser(cls, prog, description)
    ns = vars(ap.parse_args(argv))
    preset = ns.pop("config", None)
    values: dict[str, Any] = {}
    if preset:
        values.update(check(cls, load_section(preset, section), f"{preset} [{section}]"))
    hints = typing.get_type_hints(cls)
    for k, raw in ns.items():
        values[k] = _parse_cli_value(raw, _allowed(hints[k]))
    return build(cls, values, "command line" if not preset else f"{preset} + command line")


def _parse_cli_value(raw: str, allowed: tuple[Any, ...]) -> Any:
    """A command-line string as YAML (numbers, booleans, null, lists), or the raw string where the field takes a
    string and the YAML reading does not fit the field (``--model 7`` for a str field stays ``"7"``)."""
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        return raw
    if isinstance(value, str) and float in allowed:  # YAML 1.1 reads "2e-5" as a string
        with contextlib.suppress(ValueError):
            value = float(raw)
    fits = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
    return value if fits or str not in allowed else raw


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def write_resolved(cfg: Any, path: str | Path, **extra: Any) -> None:
    """Write the resolved config (plus ``extra`` provenance) as JSON, atomically."""
    write_json(path, {"config": to_dict(cfg), **extra})
