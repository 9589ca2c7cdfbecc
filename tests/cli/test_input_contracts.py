"""Nothing scored that does not belong (issue 22, items 2-6): foreign and empty phrase files, empty selections
(``--allow-empty``), duplicate ids, one UTF-8 reader naming the line, one rule for unknown fields, reruns that keep a
user's files. Every refusal exits 2 with one line naming the file (and line and field where there is one)."""

from __future__ import annotations

import json

from cli_run import assert_one_clear_error, error_lines, run_cli


def _lines(path):
    return path.read_text().splitlines()


def _write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")


# --- item 2: foreign / empty phrase files and empty selections --------------------------------------------------

def test_a_phrase_file_of_another_benchmark_is_refused_naming_its_ids(world, tmp_path):
    from eval.benchmark import Benchmark

    known = Benchmark.load(world["bench"]).query_ids[int(Benchmark.load(world["bench"]).query_rows("test")[0])]
    foreign = tmp_path / "foreign.jsonl"
    _write_lines(foreign, [json.dumps({"query_id": q, "phrase": "falling"}) for q in ("zz-1", known, "zz-2")])
    out = tmp_path / "run.parquet"
    res = run_cli("retrieval", "search", "--data", world["bench"], "--phrases", foreign, "--space", "minilm",
                  "--out", out)
    assert_one_clear_error(res, str(foreign), "2 of its 3 query ids are not in the benchmark", "'zz-1' (line 1)",
                           "'zz-2' (line 3)")
    assert not out.exists()
    res = run_cli("retrieval", "search", "--data", world["bench"], "--phrases", foreign, "--space", "minilm",
                  "--out", out, "--allow-empty")  # foreign ids are never allowed
    assert res.code == 2 and not out.exists()


def test_an_empty_phrase_file_or_one_of_another_split_needs_allow_empty(world, tmp_path):
    from eval.benchmark import Benchmark
    from eval.runs import read_run

    b = Benchmark.load(world["bench"])
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    out = tmp_path / "run.parquet"
    args = ("retrieval", "search", "--data", world["bench"], "--space", "minilm", "--out", out)
    res = run_cli(*args, "--phrases", empty)
    assert_one_clear_error(res, str(empty), "holds no phrase line", "--allow-empty")
    assert not out.exists()
    val = tmp_path / "val.jsonl"
    _write_lines(val, [json.dumps({"query_id": b.query_ids[int(r)], "phrase": "falling"}) for r in b.query_rows("val")])
    res = run_cli(*args, "--phrases", val)
    assert_one_clear_error(res, str(val), "answers a query of the selection", "--split")
    res = run_cli(*args, "--phrases", empty, "--allow-empty")
    assert res.code == 0, res.text
    run = read_run(out)
    assert len(run.query_ids) == len(b.query_rows("test")) and run.config["misses"] == len(run.query_ids)


def test_an_empty_queries_file_is_an_empty_selection(world, tmp_path):
    (world["bench"] / "queries.jsonl").write_bytes(b"")
    out = tmp_path / "random.parquet"
    res = run_cli("retrieval", "baseline", "random", "--data", world["bench"], "--out", out)
    assert_one_clear_error(res, "split 'test'", "holds no query", "queries.jsonl holds 0 queries", "--allow-empty")
    assert not out.exists()
    res = run_cli("retrieval", "baseline", "random", "--data", world["bench"], "--out", out, "--allow-empty")
    assert res.code == 0, res.text
    phrases = tmp_path / "p.jsonl"
    fc = ("forecasters", "run", "--data", world["bench"], "--out", phrases, "--forecaster", "text-only", "--backend",
          "hf", "--model", "nobody/none")
    res = run_cli(*fc)
    assert_one_clear_error(res, "holds no query", "--allow-empty")
    assert not phrases.exists()
    res = run_cli(*fc, "--allow-empty")
    assert res.code == 0, res.text


def test_a_split_without_queries_is_an_empty_selection_for_forecasters(world, tmp_path):
    res = run_cli("forecasters", "run", "--data", world["bench"], "--out", tmp_path / "p.jsonl", "--forecaster",
                  "text-only", "--backend", "hf", "--model", "nobody/none", "--qtypes", "Q5")
    assert_one_clear_error(res, "split 'test', question types Q5", "holds no query", "test ")


# --- item 3: duplicate ids --------------------------------------------------------------------------------------

def _duplicate(path, i, j):
    """Give record j the id of record i (the file keeps its record count)."""
    lines = _lines(path)
    d = json.loads(lines[j])
    d["id"] = json.loads(lines[i])["id"]
    lines[j] = json.dumps(d)
    _write_lines(path, lines)
    return d["id"]


def test_duplicate_ids_are_refused_naming_both_lines(world, tmp_path):
    from eval.validate import validate

    for name in ("corpus.jsonl", "queries.jsonl"):
        bench = tmp_path / name / "bench"
        import shutil

        shutil.copytree(world["bench"], bench, symlinks=True, ignore=shutil.ignore_patterns(".cache"))
        dup = _duplicate(bench / name, 1, 4)
        res = run_cli("retrieval", "baseline", "random", "--data", bench, "--out", tmp_path / "r.parquet")
        assert_one_clear_error(res, f"{name}:5 field 'id'", f"duplicate id {dup!r}", "first on line 2")
        res = run_cli("eval", "score", "--data", bench, "--run", world["run"], "--out", tmp_path / "rep")
        assert_one_clear_error(res, f"{name}:5 field 'id'", "first on line 2")
        rep = validate(bench)
        dups = [p for p in rep.problems if p.kind == "duplicate_id"]
        assert [(p.file, p.line) for p in dups] == [(name, 5)] and "first on line 2" in dups[0].message
        assert "count_mismatch" not in rep.kinds()  # the file holds as many records as the manifest says


# --- item 4: one UTF-8 reader ------------------------------------------------------------------------------------

def test_text_that_is_not_utf8_names_its_file_and_line(world, tmp_path):
    ids = world["bench"] / "features" / "minilm" / "states_ids.txt"
    lines = ids.read_bytes().split(b"\n")
    lines[2] = b"s\xff\xfe"
    ids.write_bytes(b"\n".join(lines))
    res = run_cli("eval", "validate", world["bench"])
    assert res.code == 1 and "Traceback" not in res.text, res.text
    assert "features/minilm/states_ids.txt:3" in res.text and "not valid UTF-8" in res.text
    res = run_cli("retrieval", "baseline", "lookup", "--data", world["bench"], "--space", "minilm", "--out",
                  tmp_path / "r.parquet")
    assert_one_clear_error(res, "states_ids.txt:3", "not valid UTF-8 (byte 0xff at column 2")
    cfg = tmp_path / "bad.yaml"
    cfg.write_bytes(b"epochs: 1\nname: caf\xe9\n")
    res = run_cli("retrieval", "lftr", "train", "--data", world["bench"], "--config", cfg, "--out", tmp_path / "m")
    assert_one_clear_error(res, f"{cfg}:2", "not valid UTF-8")


# --- item 5: unknown fields --------------------------------------------------------------------------------------

def test_an_unknown_query_field_is_one_error_in_validate_and_the_loader(world, tmp_path):
    q = world["bench"] / "queries.jsonl"
    lines = _lines(q)
    d = json.loads(lines[3])
    d["horizn"] = 2
    lines[3] = json.dumps(d)
    _write_lines(q, lines)
    res = run_cli("eval", "validate", world["bench"])
    assert res.code == 1 and "queries.jsonl:4 [horizn]: unknown field" in res.text, res.text
    assert "did you mean 'horizon'?" in res.text and "count_mismatch" not in res.text
    res = run_cli("retrieval", "baseline", "random", "--data", world["bench"], "--out", tmp_path / "r.parquet")
    line = assert_one_clear_error(res, "queries.jsonl:4 field 'horizn'", "unknown field")
    assert len(line) < 400 and "cast" not in line.lower()


# --- item 6: reruns keep a user's files; messages name the command ----------------------------------------------

def test_rerunning_into_its_own_report_keeps_the_files_a_user_added(world, tmp_path):
    out = tmp_path / "report"
    args = ("eval", "score", "--data", world["bench"], "--run", world["run"], "--out", out)
    assert run_cli(*args).code == 0
    (out / "my-notes.md").write_text("keep me")
    (out / "plots-mine").mkdir()
    (out / "plots-mine" / "fig.png").write_bytes(b"png")
    written = json.loads((out / ".psr-output.json").read_text())["written"]["files"]
    assert "report.json" in written and "my-notes.md" not in written
    res = run_cli(*args)
    assert res.code == 0, res.text
    assert (out / "my-notes.md").read_text() == "keep me" and (out / "plots-mine" / "fig.png").read_bytes() == b"png"
    assert (out / "report.json").is_file()
    assert "my-notes.md" not in json.loads((out / ".psr-output.json").read_text())["written"]["files"]


def test_a_refusal_of_eval_score_names_eval_score(world, tmp_path):
    out = tmp_path / "other"
    out.mkdir()
    (out / "x.txt").write_text("x")
    res = run_cli("eval", "score", "--data", world["bench"], "--run", world["run"], "--out", out)
    line = assert_one_clear_error(res, str(out), "`eval score`")
    assert error_lines(res) == [line]
