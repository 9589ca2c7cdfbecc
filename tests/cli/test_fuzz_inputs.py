"""Fuzzing the command lines with malformed inputs (hypothesis): torn, empty, wrong-typed, non-UTF-8 JSONL and JSON,
NaN/inf features, broken run files, mismatched benchmarks, existing --out targets.

Every property runs the real entry point (`cli_run.run_cli`) on a fresh copy of the tiny benchmark and asserts what
a user must see: a non-zero exit code (2), one ``error:`` line naming the file (and the line or row where there is
one), no traceback, nothing written to ``--out``, and every file that existed before byte-identical after.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from pathlib import Path

import numpy as np
from cli_run import assert_one_clear_error, assert_unchanged, copy_world, run_cli, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from eval.schema import REQUIRED_QUERY_FIELDS, REQUIRED_SEGMENT_FIELDS, REQUIRED_STATE_FIELDS

settings.load_profile("psr-cli")

REQUIRED = {"queries.jsonl": REQUIRED_QUERY_FIELDS, "corpus.jsonl": REQUIRED_SEGMENT_FIELDS,
            "states.jsonl": REQUIRED_STATE_FIELDS}


@contextlib.contextmanager
def fresh_world(cli_world, tmp_path):
    """A private copy of the world for one hypothesis example."""
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        yield copy_world(cli_world, Path(d))


def _run_and_check(w, args, *needles, out=None):
    """Run ``args``; assert the user-error contract and that no pre-existing file changed."""
    before = snapshot(w["root"])
    res = run_cli(*args)
    line = assert_one_clear_error(res, *needles)
    assert_unchanged(before, snapshot(w["root"]))
    if out is not None:
        assert not Path(out).exists(), f"{out} was written by a failed job"
    return line


# --- strategies -------------------------------------------------------------------------------------------------

def _wrong_value(expected):
    """A JSON value whose type differs from ``expected`` (a type or tuple of types)."""
    types = expected if isinstance(expected, tuple) else (expected,)
    pool = []
    if str not in types:
        pool.append(st.text(min_size=1, max_size=8))
    if int not in types and float not in types:
        pool.append(st.integers(-5, 5))
    if float not in types:
        pool.append(st.floats(0.1, 9.9).filter(lambda x: x != int(x)) if int in types else st.just(1.5))
    if list not in types:
        pool.append(st.lists(st.integers(0, 3), max_size=2))
    if dict not in types:
        pool.append(st.just({"k": 1}))
    pool.append(st.booleans())
    return st.one_of(pool)


@st.composite
def jsonl_corruption(draw, fields: dict, arrow: bool = False):
    """(kind, function line_text -> new line bytes) for one line of a JSONL file whose records hold ``fields``.

    ``arrow``: the file is read by Arrow's JSON reader (the benchmark's files), which reads any value of a string
    field as its JSON text (3 -> "3"); `Benchmark.load` accepts that and `eval validate` reports it, so wrong types
    are only drawn for the other fields there."""
    typed = {k: t for k, t in fields.items() if not (arrow and t is str)}
    kind = draw(st.sampled_from(["torn", "not-json", "not-an-object", "missing", "null", "invalid-utf8"]
                                + (["wrong-type"] if typed else [])))
    if kind == "torn":
        cut = draw(st.floats(0.05, 0.95))
        return kind, lambda s: s.encode()[: max(1, int(len(s.encode()) * cut))]
    if kind == "not-json":
        junk = draw(st.sampled_from(["{", "{\"id\": ", "nan", "{'id': 1}", "x" * 5, "{\"a\": 1,}"]))
        return kind, lambda s: junk.encode()
    if kind == "not-an-object":
        val = draw(st.one_of(st.lists(st.integers(), max_size=3), st.integers(), st.text(max_size=5)))
        return kind, lambda s: json.dumps(val).encode()
    field = draw(st.sampled_from(sorted(typed if kind == "wrong-type" else fields)))
    if kind == "invalid-utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\x80abc"]))

        def utf8(s):
            d = json.loads(s)
            key = field if isinstance(d.get(field), str) else next(k for k, v in d.items() if isinstance(v, str))
            marker = "\u2603PSRFUZZ\u2603"
            d[key] = d[key] + marker
            return json.dumps(d, ensure_ascii=False).encode().replace(marker.encode(), bad)
        return kind, utf8
    value = draw(_wrong_value(fields[field])) if kind == "wrong-type" else None

    def edit(s):
        d = json.loads(s)
        if kind == "missing":
            d.pop(field, None)
        else:
            d[field] = value
        return json.dumps(d).encode()
    return f"{kind}:{field}", edit


def corrupt_line(path: Path, line: int, fn) -> None:
    """Replace line ``line`` (1-based) of ``path`` by ``fn(text)``; a valid line stays after it (a torn write in
    the middle, not a torn tail)."""
    lines = path.read_bytes().split(b"\n")
    lines[line - 1] = fn(lines[line - 1].decode())
    path.write_bytes(b"\n".join(lines))


# --- the benchmark's own files ------------------------------------------------------------------------------------

@given(name=st.sampled_from(sorted(REQUIRED)), line_frac=st.floats(0, 0.999), data=st.data())
def test_malformed_benchmark_jsonl_is_named_by_file_and_line(cli_world, tmp_path, name, line_frac, data):
    kind, fn = data.draw(jsonl_corruption(REQUIRED[name], arrow=True), label="corruption")
    with fresh_world(cli_world, tmp_path) as w:
        path = w["bench"] / name
        n = len(path.read_bytes().rstrip(b"\n").split(b"\n"))
        line = min(n - 1, int(line_frac * (n - 1))) + 1 if n > 1 else 1
        line = min(line, n - 1) if n > 1 else 1  # always a valid line after the corrupted one
        corrupt_line(path, line, fn)
        out = w["root"] / "report"
        _run_and_check(w, ["eval", "score", "--data", w["bench"], "--run", w["run"], "--out", out],
                       f"{path}:{line}", out=out)


@given(bad=st.sampled_from(["", "{", "[1, 2]", "null", "{\"version\": \"1\"}", "{\"name\": 3, \"version\": \"1\"}",
                            "{\"name\": \"x\", \"version\": \"1\", \"counts\": [1]}", "\xff"]))
def test_malformed_manifest_is_named(cli_world, tmp_path, bad):
    with fresh_world(cli_world, tmp_path) as w:
        (w["bench"] / "manifest.json").write_bytes(bad.encode("latin-1"))
        out = w["root"] / "report"
        _run_and_check(w, ["eval", "score", "--data", w["bench"], "--run", w["run"], "--out", out],
                       str(w["bench"] / "manifest.json"), out=out)


@given(value=st.sampled_from([math.nan, math.inf, -math.inf]), row=st.floats(0, 0.999), col=st.integers(0, 15))
def test_non_finite_features_are_named_by_file_and_row(cli_world, tmp_path, value, row, col):
    with fresh_world(cli_world, tmp_path) as w:
        path = w["bench"] / "features" / "pixels" / "corpus.npy"
        a = np.load(path)
        r = int(row * a.shape[0])
        a[r, col % a.shape[1]] = value
        np.save(path, a)
        out = w["root"] / "sp.parquet"
        _run_and_check(w, ["retrieval", "oracle", "state-prototype", "--data", w["bench"], "--space", "pixels",
                           "--out", out], str(path), f"row {r} ", out=out)


def test_non_finite_semantic_features_stop_phrase_search(cli_world, tmp_path):
    with fresh_world(cli_world, tmp_path) as w:
        path = w["bench"] / "features" / "minilm" / "states.npy"
        a = np.load(path)
        a[2, 5] = np.inf
        np.save(path, a)
        out = w["root"] / "s.parquet"
        _run_and_check(w, ["retrieval", "search", "--data", w["bench"], "--phrases", w["phrases"], "--space", "minilm",
                           "--out", out], str(path), "row 2 ", out=out)


# --- runs ---------------------------------------------------------------------------------------------------------

@st.composite
def broken_run(draw):
    kind = draw(st.sampled_from(["torn", "garbage", "empty", "jsonl", "parquet-without-metadata"]))
    frac = draw(st.floats(0.0, 0.98))
    junk = draw(st.binary(min_size=1, max_size=64))

    def write(path: Path, good: bytes) -> None:
        if kind == "torn":
            path.write_bytes(good[: int(len(good) * frac)])
        elif kind == "garbage":
            path.write_bytes(junk)
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "jsonl":
            path.write_text('{"query_id": "q1"}\n')
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"query_id": ["q1"]}), path)
    return kind, write


@given(broken=broken_run(), command=st.sampled_from(["score", "report"]))
def test_broken_run_files_are_named(cli_world, tmp_path, broken, command):
    _, write = broken
    with fresh_world(cli_world, tmp_path) as w:
        bad = w["root"] / "runs" / "bad.parquet"
        write(bad, w["run"].read_bytes())
        out = w["root"] / "report"
        args = (["eval", "score", "--data", w["bench"], "--run", bad, "--out", out] if command == "score" else
                ["eval", "report", w["run"], bad, "--data", w["bench"], "--out", out])
        _run_and_check(w, args, str(bad), out=out)


def test_a_run_of_another_benchmark_is_refused(cli_world, synth_dir, tmp_path):
    with fresh_world(cli_world, tmp_path) as w:
        out = w["root"] / "report"
        _run_and_check(w, ["eval", "score", "--data", synth_dir, "--run", w["run"], "--out", out],
                       "was scored on benchmark 'tiny'", str(synth_dir), out=out)


def test_a_run_of_a_renamed_benchmark_is_refused(cli_world, tmp_path):
    with fresh_world(cli_world, tmp_path) as w:
        m = json.loads((w["bench"] / "manifest.json").read_text())
        m["name"] = "another-benchmark"
        (w["bench"] / "manifest.json").write_text(json.dumps(m))
        out = w["root"] / "report"
        _run_and_check(w, ["eval", "score", "--data", w["bench"], "--run", w["run"], "--out", out], "another-benchmark",
                       out=out)


def test_a_run_scored_on_an_emptied_corpus_is_refused(cli_world, tmp_path):
    with fresh_world(cli_world, tmp_path) as w:
        (w["bench"] / "corpus.jsonl").write_bytes(b"")
        out = w["root"] / "report"
        _run_and_check(w, ["eval", "score", "--data", w["bench"], "--run", w["run"], "--out", out],
                       "was scored on benchmark", out=out)


def test_a_run_with_negative_rank_statistics_is_refused(cli_world, tmp_path):
    import pyarrow.parquet as pq

    with fresh_world(cli_world, tmp_path) as w:
        t = pq.read_table(w["run"])
        col = next(c for c in t.column_names if c.endswith("/n_above"))
        vals = t.column(col).to_numpy().copy()
        vals[0] = -5
        t = t.set_column(t.column_names.index(col), col, [vals])
        pq.write_table(t, w["run"])
        out = w["root"] / "report"
        _run_and_check(w, ["eval", "score", "--data", w["bench"], "--run", w["run"], "--out", out], "n_above",
                       out=out)


# --- phrase files ---------------------------------------------------------------------------------------------------

PHRASE_FIELDS = {"query_id": str, "phrase": (str, type(None)), "phrases": list}


@given(line_frac=st.floats(0, 0.999), data=st.data())
def test_malformed_phrase_files_are_named_by_file_and_line(cli_world, tmp_path, line_frac, data):
    kind, fn = data.draw(jsonl_corruption(PHRASE_FIELDS).filter(
        lambda kf: kf[0] not in ("missing:phrase", "missing:phrases", "null:phrase", "null:phrases")),
        label="corruption")
    with fresh_world(cli_world, tmp_path) as w:
        n = len(w["phrases"].read_text().splitlines())
        line = min(n - 1, int(line_frac * (n - 1))) + 1
        corrupt_line(w["phrases"], line, fn)
        out = w["root"] / "merged.jsonl"
        _run_and_check(w, ["forecasters", "merge", w["phrases"], "--out", out], f"{w['phrases']}:{line}", out=out)


def test_malformed_phrase_file_stops_phrase_search(cli_world, tmp_path):
    with fresh_world(cli_world, tmp_path) as w:
        corrupt_line(w["phrases"], 2, lambda s: b'{"query_id": 7, "phrase": "x"}')
        out = w["root"] / "s.parquet"
        _run_and_check(w, ["retrieval", "search", "--data", w["bench"], "--phrases", w["phrases"], "--space", "minilm",
                           "--out", out], f"{w['phrases']}:2", "query_id", out=out)


def test_merge_require_complete_with_only_failed_lines_fails(cli_world, tmp_path):
    with fresh_world(cli_world, tmp_path) as w:
        rows = [json.loads(x) for x in w["phrases"].read_text().splitlines()]
        w["phrases"].write_text("".join(json.dumps({**r, "phrase": None, "phrases": [], "error": "HTTP 404"}) + "\n"
                                        for r in rows))
        res = run_cli("forecasters", "merge", w["phrases"], "--out", w["root"] / "m.jsonl", "--data", w["bench"],
                      "--require-complete")
        assert res.code == 3 and "Traceback" not in res.text  # EXIT_INCOMPLETE: the job ran, queries are unanswered
        assert len([x for x in res.err.splitlines() if x.startswith("error:")]) == 1


# --- canonicalization inputs ----------------------------------------------------------------------------------------

@given(content=st.sampled_from([b"falling\tmany\n", b"\tfalling\n", b"falling\t-3\n",
                                 b"falling\t99999999999999999999999\n", b"falling\t3\na \xff b\t2\n"]))
def test_malformed_phrase_lists_for_the_sweep(cli_world, tmp_path, content):
    with fresh_world(cli_world, tmp_path) as w:
        p = w["root"] / "p.tsv"
        p.write_bytes(content)
        out = w["root"] / "sweep"
        _run_and_check(w, ["retrieval", "canon", "sweep", "--phrases", p, "--out", out, "--model",
                           "packaged:all-MiniLM-L6-v2"], str(p), out=out)


# --- existing --out targets (beyond tests/cli/test_output_safety.py: arbitrary contents) ---------------------------

@given(content=st.one_of(st.binary(min_size=1, max_size=200),
                         st.lists(st.dictionaries(st.sampled_from(["query_id", "phrase", "id", "x"]),
                                                  st.one_of(st.text(max_size=5), st.integers()), max_size=3),
                                  min_size=1, max_size=3).map(lambda rows: "".join(json.dumps(r) + "\n"
                                                                                   for r in rows).encode())))
def test_a_file_that_is_not_a_phrase_file_is_never_replaced(cli_world, tmp_path, content):
    with fresh_world(cli_world, tmp_path) as w:
        target = w["root"] / "theirs.jsonl"
        target.write_bytes(content)
        _run_and_check(w, ["forecasters", "merge", w["phrases"], "--out", target], str(target))


# --- config files, checkpoints, stage inputs --------------------------------------------------------------------

YAML_COMMANDS = {
    "retrieval lftr train": lambda w, cfg: ["retrieval", "lftr", "train", "--data", w["bench"], "--space", "pixels",
                                            "--out", w["root"] / "ck", "--config", cfg],
    "forecasters run": lambda w, cfg: ["forecasters", "run", "--data", w["bench"], "--out", w["root"] / "p.jsonl",
                                       "--config", cfg],
    "distill narrate": lambda w, cfg: ["distill", "narrate", "--config", cfg, "--data", w["bench"], "--predicates",
                                       w["phrases"], "--out", w["root"] / "nar"],
}
#: YAML that is broken, not a mapping, or holds an unknown key / a value of the wrong type for every command above
#: (lftr: epochs, forecasters: samples; distill reads its section, so its cases are sections).
BAD_YAML = {
    "broken": b"epochs: [1\n", "a list": b"- a\n- b\n", "invalid UTF-8": b"epochs: 1\nseed: \xff\n",
    "unknown key": b"no_such_option: 1\nnarrate: {no_such_option: 1}\n",
    "wrong type": b"epochs: many\nsamples: many\nnarrate: {min_words: many}\n",
}


@given(command=st.sampled_from(sorted(YAML_COMMANDS)), bad=st.sampled_from(sorted(BAD_YAML)))
def test_malformed_config_files_are_named(cli_world, tmp_path, command, bad):
    with fresh_world(cli_world, tmp_path) as w:
        cfg = w["root"] / "config.yaml"
        cfg.write_bytes(BAD_YAML[bad])
        _run_and_check(w, YAML_COMMANDS[command](w, cfg), str(cfg))


@given(content=st.one_of(st.binary(max_size=64), st.just(b"PK\x03\x04"), st.text(max_size=20).map(str.encode)))
def test_a_checkpoint_that_is_not_one_is_named(cli_world, tmp_path, content):
    with fresh_world(cli_world, tmp_path) as w:
        ck = w["root"] / "best.pt"
        ck.write_bytes(content)
        out = w["root"] / "l.parquet"
        _run_and_check(w, ["retrieval", "lftr", "predict", "--data", w["bench"], "--ckpt", ck, "--out", out], str(ck),
                       out=out)


@given(which=st.sampled_from(["predicates", "rationales"]), line_frac=st.floats(0, 0.999), data=st.data())
def test_malformed_distill_stage_inputs_are_named(cli_world, tmp_path, which, line_frac, data):
    fields = {"query_id": str} if which == "predicates" else {"query_id": str, "rationale": str}
    kind, fn = data.draw(jsonl_corruption(fields), label="corruption")
    with fresh_world(cli_world, tmp_path) as w:
        preds = w["root"] / "predicates.jsonl"
        res = run_cli("distill", "predicates", "--data", w["bench"], "--out", preds, "--no-progress")
        assert res.code == 0, res.text
        ids = [json.loads(x)["query_id"] for x in preds.read_text().splitlines()]
        rats = w["root"] / "rationales.jsonl"
        rats.write_text("".join(json.dumps({"query_id": q, "rationale": "It keeps rolling.\nAnswer: falling"}) + "\n"
                                for q in ids))
        path = preds if which == "predicates" else rats
        n = len(ids)
        line = min(n - 1, int(line_frac * (n - 1))) + 1
        corrupt_line(path, line, fn)
        report = w["root"] / "validate.json"
        _run_and_check(w, ["distill", "validate", "--data", w["bench"], "--predicates", preds, "--rationales", rats,
                           "--out", report], f"{path}:{line}", out=report)
