"""Stage configs of the distillation recipe: dataclasses parsed by `transformers.HfArgumentParser`, with defaults from a
YAML preset.

A preset (``configs/distill/<name>.yaml``) is a mapping of sections, one per stage::

    predicates: {split: null}
    narrate:    {narrator: teacher, model: Qwen/Qwen3-32B, temperature: 0.7}
    sft:        {frames: 8, variants: [cot, answer]}
    train:      {model_name_or_path: Qwen/Qwen3-VL-8B-Instruct, learning_rate: 2.0e-5, num_train_epochs: 3}

A stage reads only its own section. The argument convention is the toolkit's (``distill train`` uses `trl.TrlParser`,
the same parser underneath): flag name = YAML key = field name, and every field is a flag in two spellings,
``--redo-failed`` and ``--redo_failed``. Booleans: ``--progress`` / ``--no-progress`` / ``--progress false``.
Lists: one word per item (``--phrases a.jsonl b.jsonl``). ``null`` (or ``none``) sets an optional field to None
(``--split null``). Precedence: dataclass default < preset section (``--config PRESET``) < flags. Unknown keys in the
preset or on the command line are errors that name the file and the key; preset values are type-checked. Each stage
writes its resolved config next to its outputs (`write_resolved`). `to_argv` is the reverse of `parse`: a config as
the flags that read it back (the recipe writes its stages' commands with it).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import types
import typing
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from eval.io import FormatError, read_yaml, write_json

C = TypeVar("C")
P = TypeVar("P", bound=argparse.ArgumentParser)
#: Words that set an optional field to None on the command line.
NULLS = ("null", "none", "~")


def load_section(path: str | Path, section: str) -> dict[str, Any]:
    """The ``section`` mapping of a YAML preset (empty when the preset has no such section)."""
    path = Path(path)
    try:
        doc = read_yaml(path)  # UTF-8 and YAML errors name the line
    except FileNotFoundError:
        raise FormatError(path, "config file does not exist") from None
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
        raise FormatError(where, f"unknown key(s) {unknown} for {cls.__name__}; known: {sorted(names)}")
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


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The stage docstring as written, and each flag's default (unless its help already says what it is)."""

    def _get_help_string(self, action):
        text = action.help or ""
        return text if "default" in text.lower() else super()._get_help_string(action)


def _or_null(convert):
    def parse(text: str):
        return None if text.lower() in NULLS else convert(text)
    parse.__name__ = getattr(convert, "__name__", "value")  # argparse names the type in its error messages
    return parse


class _StoreNullable(argparse._StoreAction):
    """A list option of an optional field: the single word ``null`` stores None."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, None if values == [None] else values)


def accept_null(parser: P, cls: type) -> P:
    """``parser`` (a `transformers.HfArgumentParser` of ``cls``) with ``null`` (`NULLS`) setting each optional
    field of ``cls`` to None: ``--split null``, ``--names null``."""
    hints = typing.get_type_hints(cls)
    for action in parser._actions:
        if action.dest in hints and type(None) in _allowed(hints[action.dest]) and action.type is not None:
            action.type = _or_null(action.type)
            if type(action) is argparse._StoreAction and action.nargs in ("+", "*"):
                action.__class__ = _StoreNullable
    return parser


def stage_parser(cls: type, prog: str, description: str):
    """The `transformers.HfArgumentParser` of a stage config: one flag per field (``--field-name`` and
    ``--field_name``; booleans also ``--no-field-name``), plus ``--config PRESET`` and, for stages whose config has no
    ``overwrite`` field, ``--overwrite`` (taken off the command line by `distill.outputs.with_overwrite`)."""
    from transformers import HfArgumentParser
    from transformers.hf_argparser import string_to_bool

    parser = kebab_first(HfArgumentParser(cls, prog=prog, description=description, formatter_class=HelpFormatter,
                                          allow_abbrev=False))
    accept_null(parser, cls)
    hints = typing.get_type_hints(cls)
    for action in parser._actions:
        if action.required:
            action.default = argparse.SUPPRESS  # help shows no "(default: None)" for a required field
    parser.add_argument("--config", metavar="PRESET", help="YAML preset; this stage reads its own section of it")
    if "overwrite" not in hints:
        parser.add_argument("--overwrite", nargs="?", const=True, default=False, type=string_to_bool,
                            help="replace an output this toolkit did not write for this stage (never an input)")
    return parser


def kebab_first(parser: P) -> P:
    """``parser`` with each option's kebab-case spelling (``--field-name``) first, the one help and usage show; the
    snake_case spelling (``--field_name``) still parses."""
    for action in parser._actions:
        action.option_strings.sort(key=lambda o: "_" in o)
    return parser


def parse(cls: type[C], section: str, argv: Sequence[str], *, prog: str, description: str) -> C:
    """Resolve a stage config: dataclass defaults < ``--config`` preset's ``section`` < flags (module docstring)."""
    parser = stage_parser(cls, prog, description)
    preset = _config_path(argv)
    where = "command line" if not preset else f"{preset} + command line"
    if preset:
        values = check(cls, load_section(preset, section), f"{preset} [{section}]")
        for action in parser._actions:
            if action.dest in values:
                action.default, action.required = values[action.dest], False
    ns, unknown = parser.parse_known_args(list(argv))
    if unknown:
        flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
        close = {u: difflib.get_close_matches(u.split("=", 1)[0], flags, n=2) for u in unknown if u.startswith("-")}
        hint = "; ".join(f"{u}: did you mean {' or '.join(c)}?" for u, c in close.items() if c)
        raise FormatError(where, f"unknown option(s) or extra value(s) {unknown} for {cls.__name__}",
                          fix=hint or f"see {prog} --help")
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(ns).items() if k in names}
    for k, v in values.items():
        if isinstance(v, list) and any(isinstance(x, str) and x.startswith("[") for x in v):
            raise FormatError(where, f"--{k.replace('_', '-')} takes one word per item, not a YAML list: {v}",
                              fix=f"e.g. --{k.replace('_', '-')} A B")
    return build(cls, values, where)


def _config_path(argv: Sequence[str]) -> str | None:
    """The value of ``--config PRESET`` / ``--config=PRESET`` in ``argv`` (the last one wins), else None."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("--config")
    ns, _ = ap.parse_known_args(list(argv))
    return ns.config


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def write_resolved(cfg: Any, path: str | Path, **extra: Any) -> None:
    """Write the resolved config (plus ``extra`` provenance) as JSON, atomically."""
    write_json(path, {"config": to_dict(cfg), **extra})


def flag(name: str, *, snake: bool = False) -> str:
    """The command-line flag of the field ``name``: ``--field-name`` (``--field_name`` with ``snake``, TRL's style)."""
    return "--" + (name if snake else name.replace("_", "-"))


def field_argv(f: dataclasses.Field, value: Any, *, snake: bool = False) -> list[str]:
    """The words that set the field ``f`` to ``value`` on a `transformers.HfArgumentParser` command line (as
    `stage_parser` or `trl.TrlParser` reads it): ``null`` for None, one word per list item (nothing for an empty list
    that is the field's default), ``--name`` / ``--no-name`` (``--name false`` when the field defaults to false) for a
    boolean."""
    name = flag(f.name, snake=snake)
    if isinstance(value, bool):
        if value:
            return [name]
        return [flag(f"no_{f.name}", snake=snake)] if f.default is True else [name, "false"]
    if value is None:
        return [name, "null"]
    if isinstance(value, (list, tuple)):
        if not value and f.default_factory is not dataclasses.MISSING and f.default_factory() == []:
            return []  # a list flag takes one or more words: the empty default is given by leaving the flag out
        if not value:
            raise ValueError(f"{f.name}: an empty list has no command-line form (a list flag takes one or more words)")
        return [name, *(_word(f.name, v) for v in value)]
    if isinstance(value, dict):
        raise ValueError(f"{f.name}: a mapping has no command-line form here")
    word = _word(f.name, value)
    return [f"{name}={word}"] if word.startswith("-") else [name, word]


def _word(name: str, value: Any) -> str:
    if isinstance(value, (dict, list, tuple)) or value is None:
        raise ValueError(f"{name}: {value!r} is not one command-line word")
    return str(value.value if isinstance(value, Enum) else value)


def to_argv(cfg: Any, fields: Sequence[str] | None = None, *, snake: bool = False) -> list[str]:
    """The flags that make the stage's parser read ``cfg``: every field in declaration order, or only ``fields`` in
    their order (the others then come from the stage's defaults or its ``--config`` preset). The inverse of `parse`:
    ``parse(type(cfg), section, to_argv(cfg), ...) == cfg``."""
    by_name = {f.name: f for f in dataclasses.fields(cfg)}
    names = list(by_name) if fields is None else list(fields)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"{type(cfg).__name__} has no field(s) {unknown}; known: {sorted(by_name)}")
    return [w for n in names for w in field_argv(by_name[n], getattr(cfg, n), snake=snake)]
