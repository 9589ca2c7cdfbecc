"""No command destroys what a user has: ``--out`` replaces only an earlier output of the same command (eval.outputs).

One test per data-loss finding of issue 11, then every writing command against every kind of existing ``--out``:
each refusal exits 2 with one line naming the path, and every file that existed before is byte-identical after.
"""

from __future__ import annotations

import json
import os

import pytest
from cli_run import assert_one_clear_error, assert_unchanged, run_cli, snapshot

MINILM = "packaged:all-MiniLM-L6-v2"


# --- the findings, as a new user met them ----------------------------------------------------------------------

def test_report_into_the_folder_of_its_input_runs_is_refused(world):
    runs = world["run"].parent
    before = snapshot(world["root"])
    for extra in ([], ["--overwrite"]):
        res = run_cli("eval", "report", world["run"], "--data", world["bench"], "--out", runs, *extra)
        assert_one_clear_error(res, str(runs), "contains an input of this job")
    assert_unchanged(before, snapshot(world["root"]))


def test_score_into_the_benchmark_is_refused(world):
    before = snapshot(world["root"])
    for extra in ([], ["--overwrite"]):
        res = run_cli("eval", "score", "--data", world["bench"], "--run", world["run"], "--out", world["bench"], *extra)
        assert_one_clear_error(res, str(world["bench"]), "is an input of this job")
    assert_unchanged(before, snapshot(world["root"]))


def test_out_naming_an_existing_file_is_refused(world):
    notes = world["root"] / "notes.txt"
    notes.write_text("my notes")
    before = snapshot(world["root"])
    res = run_cli("eval", "score", "--data", world["bench"], "--run", world["run"], "--out", notes)
    assert_one_clear_error(res, str(notes), "is a file", "--overwrite")
    assert_unchanged(before, snapshot(world["root"]))


@pytest.mark.parametrize("out", [".", ".."])
def test_out_dot_neither_crashes_nor_leaves_stray_folders(world, monkeypatch, out):
    here = world["root"] / "here"
    here.mkdir()
    (here / "keep.txt").write_text("keep")
    monkeypatch.chdir(here)
    before = snapshot(world["root"])
    for extra in ([], ["--overwrite"]):
        res = run_cli("eval", "score", "--data", world["bench"], "--run", world["run"], "--out", out, *extra)
        assert_one_clear_error(res, "current directory")
    assert_unchanged(before, snapshot(world["root"]))
    stray = [p for p in world["root"].rglob("*") if ".old-" in p.name or ".report-" in p.name]
    assert not stray and sorted(p.name for p in here.iterdir()) == ["keep.txt"]


@pytest.mark.slow
def test_same_command_replaces_its_output_another_command_is_refused(world):
    out = world["root"] / "report"
    for _ in range(2):
        res = run_cli("eval", "score", "--data", world["bench"], "--run", world["run"], "--out", out)
        assert res.code == 0, res.text
    assert json.loads((out / ".psr-output.json").read_text())["kind"] == "eval report"
    before = snapshot(world["root"])
    res = run_cli("retrieval", "canon", "sweep", "--phrases", world["phrases"], "--out", out, "--model", MINILM)
    assert_one_clear_error(res, str(out), "holds the output of `eval score` or `eval report`", "--overwrite")
    assert_unchanged(before, snapshot(world["root"]))
    # an unmarked report folder (no marker file) is recognised by its files
    (out / ".psr-output.json").unlink()
    res = run_cli("eval", "report", world["run"], "--data", world["bench"], "--out", out, "--resamples", "100")
    assert res.code == 0, res.text


def test_overwrite_replaces_a_foreign_folder_that_is_no_input(world):
    out = world["root"] / "old-stuff"
    out.mkdir()
    (out / "x.txt").write_text("x")
    res = run_cli("eval", "score", "--data", world["bench"], "--run", world["run"], "--out", out, "--overwrite")
    assert res.code == 0, res.text
    assert not (out / "x.txt").exists() and (out / "report.json").exists()


def test_encode_never_replaces_the_benchmark_s_own_features(world):
    pixels = world["bench"] / "features" / "pixels"
    before = snapshot(world["root"])
    res = run_cli("retrieval", "encode", "--data", world["bench"], "--space", "pixels", "--model", MINILM,
                  "--kind", "semantic")
    assert_one_clear_error(res, str(pixels), "was not written by this toolkit for `retrieval encode`")
    assert_unchanged(before, snapshot(world["root"]))


# --- every writing command against every kind of existing --out ------------------------------------------------

def _txt(w):
    p = w["root"] / "phrases.txt"
    if not p.exists():
        p.write_text("falling\nfalling down\nrolling\n")
    return p


def _dir(w, name):
    d = w["root"] / name
    d.mkdir(exist_ok=True)
    (d / "adapter_config.json").write_text("{}")
    return d


#: command -> (argv builder (world, out) -> args, output is a "dir" or a "file", an input to aim --out at)
COMMANDS = {
    "eval synth": (lambda w, o: ["eval", "synth", "--out", o, "--videos", "4"], "dir", None),
    "eval score": (lambda w, o: ["eval", "score", "--data", w["bench"], "--run", w["run"], "--out", o], "dir",
                   "bench"),
    "eval report": (lambda w, o: ["eval", "report", w["run"], "--data", w["bench"], "--out", o], "dir", "run"),
    "eval predictability": (lambda w, o: ["eval", "predictability", "--data", w["bench"], "--out", o, "--levels",
                                          "0:0"], "dir", "bench"),
    "eval compare": (lambda w, o: ["eval", "compare", "--data", w["bench"], "--phrases", f"m3={w['phrases']}",
                                   "--text-space", "minilm", "--lftr-run", f"minilm={w['run']}", "--out", o], "dir",
                     "run"),
    "retrieval search": (lambda w, o: ["retrieval", "search", "--data", w["bench"], "--phrases", w["phrases"],
                                       "--space", "minilm", "--out", o], "file", "phrases"),
    "retrieval fuse": (lambda w, o: ["retrieval", "fuse", "--data", w["bench"], "--run", w["run"], "--run", w["run"],
                                     "--out", o], "file", "run"),
    "retrieval baseline": (lambda w, o: ["retrieval", "baseline", "random", "--data", w["bench"], "--out", o], "file",
                           "queries"),
    "retrieval oracle": (lambda w, o: ["retrieval", "oracle", "state-prototype", "--data", w["bench"], "--space",
                                       "pixels", "--out", o], "file", "queries"),
    "retrieval lftr train": (lambda w, o: ["retrieval", "lftr", "train", "--data", w["bench"], "--space", "pixels",
                                           "--out", o], "dir", "bench"),
    "retrieval lftr predict": (lambda w, o: ["retrieval", "lftr", "predict", "--data", w["bench"], "--ckpt",
                                             w["root"] / "ck", "--out", o], "file", "queries"),
    "retrieval lftr seeds": (lambda w, o: ["retrieval", "lftr", "seeds", "--data", w["bench"], "--space", "pixels",
                                           "--out", o], "dir", "bench"),
    "retrieval demo": (lambda w, o: ["retrieval", "demo", "--data", w["bench"], "--out", o], "dir", "bench"),
    "retrieval canon sweep": (lambda w, o: ["retrieval", "canon", "sweep", "--phrases", _txt(w), "--out", o,
                                            "--model", MINILM], "dir", "txt"),
    "retrieval canon apply": (lambda w, o: ["retrieval", "canon", "apply", "--data", w["bench"], "--out", o,
                                            "--model", MINILM], "dir", "bench"),
    "retrieval canon report": (lambda w, o: ["retrieval", "canon", "report", "--data", w["bench"], "--out", o,
                                             "--exact", w["run"], "--paraphrase", w["run"]], "dir", "run"),
    "retrieval canon finetune": (lambda w, o: ["retrieval", "canon", "finetune", "--data", w["bench"], "--out", o,
                                               "--base-model", MINILM], "dir", "bench"),
    "forecasters run": (lambda w, o: ["forecasters", "run", "--data", w["bench"], "--out", o, "--forecaster",
                                      "text-only", "--backend", "hf", "--model", "nobody/none"], "file", "queries"),
    "forecasters merge": (lambda w, o: ["forecasters", "merge", w["phrases"], "--out", o], "file", "phrases"),
    "forecasters probes synonyms": (lambda w, o: ["forecasters", "probes", "synonyms", "--data", w["bench"], "--out",
                                                  o], "file", "queries"),
    "forecasters tiny-model": (lambda w, o: ["forecasters", "tiny-model", "--out", o, "--fit-data", w["bench"]], "dir",
                               "bench"),
    "distill predicates": (lambda w, o: ["distill", "predicates", "--data", w["bench"], "--out", o], "file",
                           "queries"),
    "distill validate": (lambda w, o: ["distill", "validate", "--data", w["bench"], "--predicates", w["phrases"],
                                       "--rationales", w["phrases"], "--out", o], "file", "phrases"),
    "distill narrate": (lambda w, o: ["distill", "narrate", "--data", w["bench"], "--predicates", w["phrases"],
                                      "--out", o], "dir", "bench"),
    "distill sft": (lambda w, o: ["distill", "sft", "--data", w["bench"], "--rationales", w["phrases"], "--out", o],
                    "dir", "bench"),
    "distill train": (lambda w, o: ["distill", "train", "--model_name_or_path", "m", "--dataset_name", _dir(w, "sft"),
                                    "--output_dir", o], "dir", "sft"),
    "distill faithfulness": (lambda w, o: ["distill", "faithfulness", "--data", w["bench"], "--model", "m",
                                           "--predicates", w["phrases"], "--out", o], "dir", "bench"),
    "distill counterfactuals": (lambda w, o: ["distill", "counterfactuals", "--predicates", w["phrases"], "--out", o],
                                "file", "phrases"),
    "distill rationale-stats": (lambda w, o: ["distill", "rationale-stats", "--data", w["bench"], "--rationales",
                                              w["phrases"], "--out", o], "dir", "bench"),
    "distill answers": (lambda w, o: ["distill", "answers", "--data", w["bench"], "--phrases", w["phrases"],
                                      "--out", o], "dir", "bench"),
    "distill recipe": (lambda w, o: ["distill", "recipe", "--data", w["bench"], "--model", "m", "--forecast_backend",
                                     "hf", "--out", o], "dir", "bench"),
    "distill merge": (lambda w, o: ["distill", "merge", "--model", "m", "--adapter", _dir(w, "adapter"), "--out", o],
                      "dir", "adapter"),
}


def _input_path(w, which):
    return {"bench": w["bench"], "run": w["run"], "phrases": w["phrases"], "queries": w["bench"] / "queries.jsonl",
            "txt": _txt(w), "sft": _dir(w, "sft"), "adapter": _dir(w, "adapter")}[which]


def _foreign(w, how: str):
    """An existing --out that this toolkit did not write: a folder with a file, a file, or another command's output."""
    p = w["root"] / f"theirs-{how}"
    if how == "file":
        p.write_text("precious\n")
    else:
        p.mkdir()
        (p / "thesis.tex").write_text("years of work")
        if how == "other-kind":
            (p / ".psr-output.json").write_text(json.dumps({"marker": 1, "kind": "someone else", "toolkit":
                                                            "psr-toolkit", "version": "0"}))
    return p


@pytest.mark.parametrize("how", ["folder", "file", "other-kind"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_an_out_it_did_not_write(world, command, how):
    argv, kind, _ = COMMANDS[command]
    out = _foreign(world, how)
    argv(world, out)  # create the command's own inputs before the snapshot
    before = snapshot(world["root"])
    res = run_cli(*argv(world, out))
    line = assert_one_clear_error(res, str(out))
    assert ("is a directory" if kind == "file" and how != "file" else "--overwrite") in line
    assert_unchanged(before, snapshot(world["root"]))


@pytest.mark.parametrize("command", sorted(c for c, v in COMMANDS.items() if v[2] is not None))
def test_no_command_replaces_its_own_input_even_with_overwrite(world, command):
    argv, _, which = COMMANDS[command]
    out = _input_path(world, which)
    argv(world, out)
    before = snapshot(world["root"])
    res = run_cli(*argv(world, out), "--overwrite")
    line = assert_one_clear_error(res, str(out))
    assert "an input of this job" in line
    assert_unchanged(before, snapshot(world["root"]))


@pytest.mark.parametrize("command", ["retrieval baseline", "distill narrate"])
def test_file_and_folder_outputs_refuse_out_dot(world, monkeypatch, command):
    argv, _, _ = COMMANDS[command]
    monkeypatch.chdir(world["root"])
    before = snapshot(world["root"])
    res = run_cli(*argv(world, "."), "--overwrite")
    assert_one_clear_error(res)
    assert_unchanged(before, snapshot(world["root"]))
    assert not [p for p in world["root"].parent.iterdir() if ".old-" in p.name]
    assert os.getcwd() == str(world["root"])
