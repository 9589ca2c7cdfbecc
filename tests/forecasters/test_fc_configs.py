"""The shipped run configs (configs/forecasters/*.yaml) load through ``forecasters run --config``'s reader into the run
config with no unknown key and values of the field's type, and resolve to their preset's model and vLLM engine
settings (no model is loaded)."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import pytest

from forecasters.cli import _load_yaml
from forecasters.presets import PRESETS, VLLM_DEFAULTS
from forecasters.registry import get_forecaster
from forecasters.runner import RunConfig, backend_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "forecasters"
#: file stem -> the preset its model must resolve to (a new file gets a line here)
EXPECTED = {"m3": "m3", "m3-server": "m3", "text-only": "text-only", "llava": "llava", "llava-video": "llava-video-7b",
            "student": "student-8b"}


def _fits(value, hint) -> bool:
    """``value`` is an instance of the type hint (``X | None``, ``list[str]``, ``float`` admitting an int)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint) or hint
    if origin is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin)


def test_every_shipped_config_is_listed():
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_config_loads_into_the_run_config_and_resolves_to_its_preset(stem):
    values = _load_yaml(CONFIGS / f"{stem}.yaml")  # raises FormatError on an unknown key
    assert values and not {"data", "out"} & set(values)  # given on the command line
    hints = typing.get_type_hints(RunConfig)
    wrong = {k: v for k, v in values.items() if not _fits(v, hints[k])}
    assert not wrong, f"values of the wrong type: {wrong}"
    cfg = RunConfig(data="data/psr", out="runs/x.jsonl", **values)
    spec = get_forecaster(cfg.forecaster)
    preset = EXPECTED[stem]
    assert PRESETS.get(cfg.model or spec.default_model, cfg.model) == PRESETS[preset]
    engine = backend_config(cfg, PRESETS[preset])
    assert engine.model == PRESETS[preset]
    if cfg.backend == "vllm":  # the preset's engine settings, unless the file sets its own
        assert cfg.model == preset
        for name, default in VLLM_DEFAULTS[preset].items():
            assert getattr(engine, name) == values.get(name, default), name
    assert cfg.frame_selection() is not None and cfg.shard_spec() == (0, 1)
    assert {f.name for f in dataclasses.fields(RunConfig)} >= set(values)
