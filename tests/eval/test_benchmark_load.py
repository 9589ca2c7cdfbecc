"""Benchmark.load refuses what would break a job later, naming the file, line and field."""

from __future__ import annotations

import json
import shutil

import pytest

from eval.benchmark import Benchmark
from eval.errors import InputError
from eval.io import FormatError


@pytest.fixture
def bench_copy(synth_dir, tmp_path):
    return shutil.copytree(synth_dir, tmp_path / "b", ignore=shutil.ignore_patterns(".cache", "frames", "sim"))


def _edit_line(path, line, fn):
    lines = path.read_bytes().split(b"\n")
    lines[line - 1] = fn(lines[line - 1])
    path.write_bytes(b"\n".join(lines))


def test_invalid_utf8_is_refused_with_file_line_and_field(bench_copy):
    q = bench_copy / "queries.jsonl"
    _edit_line(q, 5, lambda b: b.replace(b'"question": "', b'"question": "\xff\xfe', 1))
    with pytest.raises(FormatError, match=r"queries.jsonl:5 field 'question': not valid UTF-8 \(byte 0xff") as e:
        Benchmark.load(bench_copy)
    assert e.value.line == 5 and e.value.field == "question"


def test_invalid_utf8_is_refused_on_a_cached_load_too(bench_copy):
    Benchmark.load(bench_copy)  # builds the Arrow cache from the valid file
    s = bench_copy / "states.jsonl"
    _edit_line(s, 2, lambda b: b.replace(b'"text": "', b'"text": "\xc3\x28', 1))
    with pytest.raises(FormatError, match=r"states.jsonl:2 field 'text': not valid UTF-8"):
        Benchmark.load(bench_copy)


def test_null_or_missing_required_fields_and_bad_types_are_named(bench_copy):
    c = bench_copy / "corpus.jsonl"
    original = c.read_bytes()

    def set_field(key, value):
        def fn(b):
            d = json.loads(b)
            if value is KeyError:
                d.pop(key)
            else:
                d[key] = value
            return json.dumps(d).encode()
        return fn

    for key, value, needle in [("state_id", None, "required field missing"),
                               ("video_id", KeyError, "required field missing"),
                               ("start", "soon", "expected int or float, got str")]:
        c.write_bytes(original)
        _edit_line(c, 3, set_field(key, value))
        with pytest.raises(FormatError, match=rf"corpus.jsonl:3 field '{key}': {needle}"):
            Benchmark.load(bench_copy)


@pytest.mark.parametrize("content, needle", [
    (b"[1, 2]", "expected a JSON object, got list"),
    (b'{"version": "1"}', "field 'name': required string field"),
    (b'{"name": "x", "version": "1", "spaces": [1]}', "field 'spaces': expected dict, got list"),
    (b'{"name": "x",\n "version": "\xff"}', r"manifest.json:2: not valid UTF-8"),
])
def test_a_malformed_manifest_is_named(bench_copy, content, needle):
    (bench_copy / "manifest.json").write_bytes(content)
    with pytest.raises(FormatError, match=needle):
        Benchmark.load(bench_copy)


def test_typed_records_are_those_of_datasets_row_iteration(synth_bench):
    from eval.schema import Query, Segment, State

    assert synth_bench.queries() == [Query.from_dict(r) for r in synth_bench.queries_ds]
    rows = synth_bench.query_rows("test", fair_only=True)
    assert synth_bench.queries("test", fair_only=True) == [Query.from_dict(r) for r in synth_bench.queries_ds.select(rows)]
    assert synth_bench.segments() == [Segment.from_dict(r) for r in synth_bench.corpus_ds]
    assert synth_bench.states() == [State.from_dict(r) for r in synth_bench.states_ds]


def test_query_field_reads_what_the_typed_queries_hold(synth_bench):
    for split in (None, "train", "test"):
        typed = synth_bench.queries(split)
        assert synth_bench.query_field("video_id", split) == {q.id: q.video_id for q in typed}
        assert set(synth_bench.query_field("id", split)) == {q.id for q in typed}
    with pytest.raises(InputError, match="no field 'nope'"):
        synth_bench.query_field("nope")


def test_files_that_passed_are_not_checked_again_until_one_changes(bench_copy, monkeypatch):
    import eval.benchmark as B

    calls: list[str] = []
    real = B._check_arrow
    monkeypatch.setattr(B, "_check_arrow", lambda path, ds: (calls.append(path.name), real(path, ds)))
    Benchmark.load(bench_copy)
    assert calls == ["queries.jsonl", "corpus.jsonl", "states.jsonl"]
    assert (bench_copy / ".cache" / B.VALIDATED_FILE).exists()
    Benchmark.load(bench_copy)  # the same files: the note stands
    assert len(calls) == 3
    # any write to a file (here one that keeps its size) makes every file be checked again
    q = bench_copy / "queries.jsonl"
    q.write_bytes(q.read_bytes())
    Benchmark.load(bench_copy)
    assert len(calls) == 6
    # a note of other checks (another version) is not taken either
    monkeypatch.setattr(B, "VALIDATION_VERSION", B.VALIDATION_VERSION + 1)
    Benchmark.load(bench_copy)
    assert len(calls) == 9
