"""eval.outputs / eval.io.atomic_dir: an output replaces only what the toolkit wrote for the same kind of output."""

from __future__ import annotations

import json

import pytest

from eval.errors import OutputRefused
from eval.io import atomic_dir
from eval.outputs import MARKER, check_output_dir, check_output_file, claim_dir, jsonl_with_keys, read_marker


def _write(stage, name="a.txt", text="x"):
    (stage / name).write_text(text)


def test_a_foreign_directory_is_refused_and_kept_unless_overwrite(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    refused = r"mine is not empty and was not written by this toolkit.*--overwrite"
    with pytest.raises(OutputRefused, match=refused), atomic_dir(out, kind="eval report") as stage:
        _write(stage)
    assert (out / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # the refused job left no stage behind
    with atomic_dir(out, kind="eval report", overwrite=True) as stage:
        _write(stage)
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "a.txt"]
    assert read_marker(out)["kind"] == "eval report"


def test_same_kind_is_replaced_another_kind_is_refused(tmp_path):
    out = tmp_path / "o"
    with atomic_dir(out, kind="retrieval canon sweep") as stage:
        _write(stage, "sweep.json")
    with atomic_dir(out, kind="retrieval canon sweep") as stage:
        _write(stage, "sweep2.json")
    assert (out / "sweep2.json").exists() and not (out / "sweep.json").exists()
    other = "holds the output of `retrieval canon sweep`, not of `eval score` or `eval report`"
    with pytest.raises(OutputRefused, match=other), atomic_dir(out, kind="eval report") as stage:
        _write(stage)
    assert (out / "sweep2.json").exists()


def test_kind_none_replaces_only_an_empty_directory(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    with atomic_dir(out) as stage:
        _write(stage)
    with pytest.raises(OutputRefused), atomic_dir(out) as stage:
        _write(stage)


def test_inputs_are_never_replaced_even_with_overwrite(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "a.parquet").write_bytes(b"run")
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "manifest.json").write_text("{}")
    (bench / "features").mkdir()
    (bench / "features" / "x.npy").write_bytes(b"features")
    cases = [(runs, [runs / "a.parquet"], "contains an input"), (bench, [bench], "is an input"),
             (bench / "features", [bench], "inside an input")]
    for out, inputs, how in cases:
        for overwrite in (False, True):
            with pytest.raises(OutputRefused, match=how):
                check_output_dir(out, "eval report", inputs=inputs, overwrite=overwrite)
    assert (runs / "a.parquet").read_bytes() == b"run" and (bench / "features" / "x.npy").exists()
    # inside an input: a new output, and later the same output again, are fine
    for _ in range(2):
        with atomic_dir(bench / "report", kind="eval report", inputs=[bench]) as stage:
            _write(stage)
    assert (bench / "manifest.json").read_text() == "{}"
    # a missing input (a model id, an unset option) protects nothing and refuses nothing
    check_output_dir(tmp_path / "new", "eval report", inputs=["BAAI/bge-small-en-v1.5", None])


@pytest.mark.parametrize("name", [".", ".."])
def test_out_dot_is_refused_cleanly(tmp_path, monkeypatch, name):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("keep")
    monkeypatch.chdir(work)
    with pytest.raises(OutputRefused, match="current directory"), atomic_dir(name, kind="eval report", overwrite=True):
        pass
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]  # no stray .old-* or stage folder


def test_a_file_where_a_folder_goes(tmp_path):
    f = tmp_path / "out"
    f.write_text("mine")
    with pytest.raises(OutputRefused, match="is a file, not an output folder"):
        check_output_dir(f, "eval report")
    with atomic_dir(f, kind="eval report", overwrite=True) as stage:
        _write(stage)
    assert f.is_dir()
    d = claim_dir(tmp_path / "fresh", "distill narrate")
    assert read_marker(d)["kind"] == "distill narrate"


def test_file_outputs_are_recognised_by_content(tmp_path):
    phrase = jsonl_with_keys("query_id", "config_hash")
    ours = tmp_path / "p.jsonl"
    ours.write_text(json.dumps({"query_id": "q1", "config_hash": "abc"}) + "\n")
    check_output_file(ours, "phrase", recognise=phrase)
    empty = tmp_path / "e.jsonl"
    empty.write_bytes(b"")
    check_output_file(empty, "phrase", recognise=phrase)
    theirs = tmp_path / "queries.jsonl"
    theirs.write_text(json.dumps({"id": "q1"}) + "\n")
    with pytest.raises(OutputRefused, match="queries.jsonl exists and is not a phrase file"):
        check_output_file(theirs, "phrase", recognise=phrase)
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(OutputRefused):
        check_output_file(binary, "phrase", recognise=phrase)
    check_output_file(theirs, "phrase", recognise=phrase, overwrite=True)
    with pytest.raises(OutputRefused, match="is a directory"):
        check_output_file(tmp_path, "phrase", recognise=phrase, overwrite=True)


def test_legacy_outputs_without_a_marker(tmp_path):
    old = tmp_path / "old-report"
    old.mkdir()
    for name in ("report.json", "report_config.json", "main.md"):
        (old / name).write_text("{}")
    with atomic_dir(old, kind="eval report", recognise=("report.json", "report_config.json")) as stage:
        _write(stage)
    assert read_marker(old)["kind"] == "eval report"


def test_a_target_that_changes_during_the_job_keeps_the_finished_output(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(OutputRefused, match="the finished output is kept in"), \
            atomic_dir(out, kind="eval report") as stage:
        _write(stage, "result.txt", "done")
        out.mkdir()
        (out / "theirs.txt").write_text("appeared meanwhile")
    assert (out / "theirs.txt").read_text() == "appeared meanwhile"
    kept = [p for p in tmp_path.glob("o.new-*/o/result.txt")]
    assert len(kept) == 1 and kept[0].read_text() == "done"
