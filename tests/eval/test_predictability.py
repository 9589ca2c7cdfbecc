"""The predictability ceiling (eval.synth.predictability): re-simulating a build's videos reproduces every answer,
a perturbation after the prefix changes some, and the R@5 of foresight is bounded by naming the state."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from eval.errors import InputError
from eval.synth.predictability import Perturbation, Question, _Prefix, _video_job, answer, measure


def _seg(key: str, start: int, stop: int):
    return SimpleNamespace(state=SimpleNamespace(key=key), start=start, stop=stop)


TRAJ = [_seg("a", 0, 10), _seg("b", 10, 20), _seg("c", 20, 30), _seg("b", 30, 40), _seg("d", 40, 60)]


def test_answer_rules_follow_the_build_questions():
    fps = 20.0
    assert answer(TRAJ, Question("Q1", 12), fps) == "c"  # the first segment starting after the prefix
    assert answer(TRAJ, Question("Q1", 45), fps) is None  # no state after the prefix
    assert answer(TRAJ, Question("Q2", 5), fps) == "d"  # the end state
    assert answer(TRAJ, Question("Q3", 5, k_seconds=0.25), fps) == "b"  # frame 10
    assert answer(TRAJ, Question("Q3", 5, k_seconds=0.2), fps) == "a"  # frame 9: still the current state
    assert answer(TRAJ, Question("Q3", 5, k_seconds=9.0), fps) == "d"  # past the end: the last state
    # Q4: the state before the first segment after the prefix in the anchor's state
    assert answer(TRAJ, Question("Q4", 5, anchor="b"), fps) == "a"
    assert answer(TRAJ, Question("Q4", 15, anchor="b"), fps) == "c"  # "b" of frame 10 began before the prefix ended
    assert answer(TRAJ, Question("Q4", 5, anchor="z"), fps) is None  # the anchor is never reached
    with pytest.raises(InputError, match="Q5"):
        answer(TRAJ, Question("Q5", 5), fps)


@pytest.mark.parametrize("text", ["0.2", "a:b", "1:2:3", "-1:0", "nan:0", "0:inf"])
def test_perturbation_parse_refuses_bad_levels(text):
    with pytest.raises(InputError, match="perturbation"):
        Perturbation.parse(text)


def test_perturbation_parse_and_key():
    p = Perturbation.parse("0.2:0.01")
    assert (p.pos_sd, p.vel_sd, p.label, p.none) == (0.2, 0.01, "0.2:0.01", False)
    assert Perturbation.parse("0:0").none and p.key == (200000, 10000)


@pytest.fixture(scope="module")
def unperturbed_and_strong(synth_dir):
    return measure(synth_dir, [Perturbation(0.0, 0.0), Perturbation(5.0, 0.3)], workers=1, progress=False)


def test_unperturbed_resimulation_keeps_every_answer(unperturbed_and_strong):
    m = unperturbed_and_strong
    assert len(m.query_ids) > 20
    assert set(m.qtypes) <= {"Q1", "Q2", "Q3", "Q4"}
    assert m.kept(0).all()  # the simulator is deterministic and the answer rules are the build's
    assert all(a is not None for a in m.answers[0])
    # the labels' own limit: foresight of the true state, named by its usual label, is at most naming the state
    assert 0 < m.ceiling_r5(0) <= m.naming_r5 + 1e-9


def test_a_strong_perturbation_changes_some_answers(unperturbed_and_strong):
    m = unperturbed_and_strong
    kept = m.kept(1)
    assert 0 < kept.mean() < 1
    # a kept answer names the same usual label as the unperturbed one
    assert (m.label_hit[1][kept] == m.label_hit[0][kept]).all()
    s = m.summary()
    assert [lv["perturbation"] for lv in s["levels"]] == ["0:0", "5:0.3"]
    assert sum(g["n"] for g in s["levels"][1]["by_question"].values()) == len(m.query_ids)
    assert np.isfinite(s["px_per_unit"]) and s["px_per_unit"] > 0


def test_the_same_level_draws_the_same_answers(synth_dir, unperturbed_and_strong):
    again = measure(synth_dir, [Perturbation(5.0, 0.3)], workers=2, progress=False)
    assert again.answers[0] == unperturbed_and_strong.answers[1]


def test_a_record_this_simulator_does_not_reproduce_is_refused(synth_dir):
    vid = sorted(p.stem for p in (synth_dir / "sim").glob("v*.npz"))[0]
    extra = json.loads((synth_dir / "manifest.json").read_text())["extra"]
    # video index 0 of another seed is another scene: its stored record is not what the simulator gives
    with pytest.raises(InputError, match="does not reproduce"):
        _video_job(str(synth_dir), extra["seed"] + 1, 0, "workshop", vid, (_Prefix("o0", 10, ()),),
                   (Perturbation(),))


def test_not_a_synthetic_benchmark_is_refused(tmp_path, synth_dir):
    import shutil

    d = tmp_path / "bench"
    shutil.copytree(synth_dir, d, symlinks=True, ignore=shutil.ignore_patterns("frames", "features", "sim", ".cache"))
    m = json.loads((d / "manifest.json").read_text())
    m["extra"].pop("seed")
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError, match="not a synthetic benchmark"):
        measure(d, [Perturbation()], workers=1, progress=False)


def test_cli_writes_its_outputs_and_refuses_what_it_did_not_write(synth_dir, tmp_path):
    from typer.testing import CliRunner

    from eval.cli import app

    out, doc = tmp_path / "out", tmp_path / "docs" / "predictability.md"
    argv = ["predictability", "--data", str(synth_dir), "--out", str(out), "--levels", "0:0", "--workers", "1",
            "--doc", str(doc)]
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 0, r.output
    s = json.loads((out / "predictability.json").read_text())
    assert s["levels"][0]["kept"] == 1.0 and len(s["per_query"]["ids"]) == s["queries"]
    assert (out / "predictability.md").read_text() in doc.read_text()
    assert doc.read_text().startswith("# The predictability ceiling")
    # a rerun replaces its own outputs; a file or folder it did not write is never replaced
    assert CliRunner().invoke(app, argv).exit_code == 0
    doc.write_text("my notes\n")
    r = CliRunner().invoke(app, argv)
    assert r.exit_code != 0 and doc.read_text() == "my notes\n"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("keep")
    r = CliRunner().invoke(app, ["predictability", "--data", str(synth_dir), "--out", str(mine), "--levels", "0:0"])
    assert r.exit_code != 0 and sorted(p.name for p in mine.iterdir()) == ["keep.txt"]
