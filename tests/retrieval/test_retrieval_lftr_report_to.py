"""``--report-to`` on LFTR training (`eval.tracking`): TensorBoard scalars equal history.jsonl, across a resume;
W&B gets the same records (a recording stand-in: wandb is not installed here); a tracker that is not installed is
one clear error before any work."""

from __future__ import annotations

import json
import sys
import types

import pytest
from cli_run import assert_one_clear_error, run_cli

from eval.errors import InputError, MissingDependency
from eval.tracking import numeric_fields, parse_report_to

TINY = [x for kv in ("d_model=32", "n_layers=1", "n_heads=2", "n_samples=4", "epochs=3", "threads=1", "batch_size=8",
                     "n_random_negatives=16", "n_hard_negatives=4") for x in ("--set", kv)]


def _train(data, out, *extra):
    return run_cli("retrieval", "lftr", "train", "--data", data, "--space", "pixels", "--prefix-space", "pixels",
                   "--out", out, *TINY, *extra)


def _history(ck) -> list[dict]:
    return [json.loads(line) for line in (ck / "history.jsonl").read_text().splitlines()]


def test_tensorboard_scalars_equal_history_across_a_resume(tiny_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ck = tmp_path / "ck"
    r = _train(tiny_dir, ck, "--report-to", "tensorboard", "--stop-after", "1")
    assert r.code == 0, r.text
    r = _train(tiny_dir, ck, "--report-to", "tensorboard")  # resumes after epoch 1, reports epoch 1 again
    assert r.code == 0 and "resumed" in r.text, r.text
    history = _history(ck)
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert len(list((ck / "runs").glob("events.out.tfevents.*"))) == 2  # one event file per call
    acc = EventAccumulator(str(ck / "runs"))
    acc.Reload()
    keys = sorted({k for h in history for k in numeric_fields(h)})
    assert {"loss", "nce", "ground", "lr", "train_seconds", "val_R@5", "val_seconds"} <= set(keys)
    assert sorted(acc.Tags()["scalars"]) == keys
    for k in keys:
        logged = acc.Scalars(k)
        want = [(h["epoch"], h[k]) for h in history if k in h]
        assert [e.step for e in logged] == [s for s, _ in want], k  # each epoch once: the resume purged its copy
        assert [e.value for e in logged] == pytest.approx([v for _, v in want], rel=1e-6), k
    assert "report_to: tensorboard" in (ck / "config.yaml").read_text()


def test_report_to_is_not_part_of_the_training_hash():
    from retrieval.lftr.config import LFTRConfig

    assert LFTRConfig(report_to="tensorboard").training_hash() == LFTRConfig().training_hash()
    with pytest.raises(InputError, match="unknown tracker"):
        LFTRConfig(report_to="mlflow")


def test_wandb_gets_every_epoch_and_a_resume_continues_its_run(tiny_dir, tmp_path, monkeypatch):
    """The W&B calls through a module that records them (the real wandb is not installed on this machine)."""
    calls: list[tuple] = []

    class Run:
        def log(self, values, step):
            calls.append(("log", step, values))

        def finish(self):
            calls.append(("finish",))

    def init(**kw):
        calls.append(("init", kw))
        return Run()

    fake = types.ModuleType("wandb")
    fake.init = init
    fake.__spec__ = types.SimpleNamespace(name="wandb")  # what importlib.util.find_spec looks at in sys.modules
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_PROJECT", "psr-test")
    ck = tmp_path / "ck"
    assert _train(tiny_dir, ck, "--report-to", "wandb", "--stop-after", "2").code == 0
    assert _train(tiny_dir, ck, "--report-to", "wandb").code == 0
    inits = [c[1] for c in calls if c[0] == "init"]
    run_id = (ck / "wandb-run-id").read_text().strip()
    assert len(inits) == 2 and all(i["id"] == run_id and i["resume"] == "allow" for i in inits)
    assert inits[0]["project"] == "psr-test" and inits[0]["dir"] == str(ck) and inits[0]["name"] == "ck"
    assert inits[0]["config"]["report_to"] == "wandb" and inits[0]["config"]["epochs"] == 3
    history = {h["epoch"]: h for h in _history(ck)}
    logs = [(c[1], c[2]) for c in calls if c[0] == "log"]
    assert [s for s, _ in logs] == [1, 2, 2, 3]  # the resume logs its last finished epoch again
    for step, values in logs:
        assert values == numeric_fields(history[step])
    assert [c[0] for c in calls].count("finish") == 2


def test_a_tracker_that_is_not_installed_is_one_clear_error(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` fails, find_spec finds nothing
    res = _train(tiny_dir, tmp_path / "ck", "--report-to", "tensorboard")
    assert_one_clear_error(res, "--report-to tensorboard: tensorboard is not installed", "pip install tensorboard")
    assert not (tmp_path / "ck").exists()  # refused before any work
    res = _train(tiny_dir, tmp_path / "ck", "--report-to", "mlflow")
    assert_one_clear_error(res, "unknown tracker(s) ['mlflow']", "none, all, or a comma-separated list")
    assert not (tmp_path / "ck").exists()


def test_parse_report_to_values(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert parse_report_to(None) == parse_report_to("none") == parse_report_to("") == ()
    assert parse_report_to("all") == ("tensorboard",)  # whichever is installed
    assert parse_report_to(["TensorBoard"]) == parse_report_to("tensorboard,tensorboard") == ("tensorboard",)
    assert parse_report_to("wandb,tensorboard", check_installed=False) == ("tensorboard", "wandb")
    with pytest.raises(MissingDependency, match="wandb is not installed") as e:
        parse_report_to("tensorboard,wandb")
    assert e.value.fix == "pip install wandb"
    with pytest.raises(InputError, match="'all' stands alone"):
        parse_report_to("all,wandb")
