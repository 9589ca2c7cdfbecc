"""The command line of `forecasters`: ``run``'s options are generated from `RunConfig` (one definition per option),
and ``list`` says what each forecaster's prompt carries."""

from __future__ import annotations

import dataclasses

import typer
from typer.testing import CliRunner

from forecasters.cli import app
from forecasters.registry import FORECASTERS
from forecasters.run_config import RunConfig

#: flags that are not ``--field-name``
SPECIAL_FLAGS = {"forecaster": ["--forecaster", "-f"], "backend": ["--backend", "-b"], "model": ["--model", "-m"]}
SWITCHES = {"enforce_eager": "--no-enforce-eager", "progress": "--no-progress"}


def _run_params():
    return {p.name: p for p in typer.main.get_command(app).commands["run"].params}


def test_run_options_are_exactly_the_run_config_fields():
    params = _run_params()
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    assert set(params) == set(fields) | {"config", "verbose"}
    for name, f in fields.items():
        p = params[name]
        assert p.opts == SPECIAL_FLAGS.get(name, ["--" + name.replace("_", "-")]), name
        assert list(p.secondary_opts) == ([SWITCHES[name]] if name in SWITCHES else []), name
        if f.default is dataclasses.MISSING:
            assert p.required, name
        else:
            assert p.default == f.default and not p.required, name
        assert p.help and p.help == f.metadata["help"], name


def test_run_options_parse_into_the_run_config(tmp_path, monkeypatch):
    """Values given on the command line reach `RunConfig` under the field's name (the job itself is stubbed)."""
    import forecasters.runner as runner

    seen = {}

    def fake_run(cfg):
        seen["cfg"] = cfg
        raise SystemExit(0)

    monkeypatch.setattr(runner, "run", fake_run)
    monkeypatch.setattr("forecasters.cli.check_phrase_out", lambda *a, **k: None)
    (tmp_path / "manifest.json").write_text("{}")  # what --data's check looks for
    r = CliRunner().invoke(app, ["run", "--data", str(tmp_path), "--out", "o.jsonl", "-f", "text-only", "--limit", "3",
                                 "--qtypes", "Q1", "--qtypes", "Q2", "--frames", "spaced:4", "--no-progress",
                                 "--split", "all", "--max-tokens", "9", "--no-enforce-eager"])
    assert r.exit_code == 0, r.output
    cfg = seen["cfg"]
    assert (cfg.forecaster, cfg.limit, cfg.qtypes, cfg.frames, cfg.progress, cfg.split, cfg.max_tokens,
            cfg.enforce_eager) == ("text-only", 3, ["Q1", "Q2"], "spaced:4", False, None, 9, False)
    assert cfg.backend == "hf" and cfg.temperature == 0.0 and cfg.out == "o.jsonl"


def test_list_names_the_media_of_each_forecaster():
    kinds = {name: s.media_kind for name, s in FORECASTERS.items()}
    assert kinds["text-only"] == kinds["paraphrase"] == "none"
    assert kinds["m3"] == kinds["describe"] == "images" and kinds["llava-video"] == "video"
    r = CliRunner().invoke(app, ["list"], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if line.strip("│ ").startswith("text-only "))
    assert "none" in row and "images" not in row


def test_tiny_model_fit_shows_progress_unless_turned_off(synth_dir, tmp_path):
    on = CliRunner().invoke(app, ["tiny-model", "--out", str(tmp_path / "on"), "--fit-data", str(synth_dir),
                                  "--fit-steps", "2"])
    off = CliRunner().invoke(app, ["tiny-model", "--out", str(tmp_path / "off"), "--fit-data", str(synth_dir),
                                   "--fit-steps", "2", "--no-progress"])
    assert on.exit_code == off.exit_code == 0, (on.output, off.output)
    assert "fit tiny model" in on.output and "2/2" in on.output
    assert "fit tiny model" not in off.output
    assert (tmp_path / "on" / "config.json").is_file() and (tmp_path / "off" / "config.json").is_file()
