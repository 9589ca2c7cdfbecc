"""The resumable-JSONL layer (`eval.resumable`) under the forecaster runner and the narration job."""

from __future__ import annotations

import json

import pytest

from eval.io import FormatError
from eval.resumable import Appender, cut_torn_tail, locked, read_records, scan


def _write(path, rows, tail=b""):
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows) + tail)


def test_scan_reads_complete_lines_and_measures_a_torn_tail(tmp_path):
    p = tmp_path / "a.jsonl"
    assert scan(p).rows == [] and scan(p).torn_tail == 0  # a missing file is empty
    rows = [{"query_id": "q1", "config_hash": "h"}, {"query_id": "q2", "config_hash": "g"}]
    _write(p, rows, tail=b'{"query_id": "q3"}')  # parses, but without its newline it is not complete
    lines = scan(p)
    assert [d for _, d in lines.rows] == rows and lines.torn_tail == len(b'{"query_id": "q3"}')
    assert lines.keys() == {"q1", "q2"} and lines.keys(config_hash="h") == {"q1"}
    assert lines.config_hashes() == {"h": 1, "g": 1}
    assert [r["query_id"] for r in read_records(p)] == ["q1", "q2", "q3"]  # readers of inputs stay lenient


def test_scan_names_a_malformed_line(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"query_id": "q1"}\nnot json\n{"query_id": "q2"}\n')
    with pytest.raises(FormatError) as e:
        scan(p)
    assert e.value.line == 2
    p.write_bytes(b'{"query_id": "q1"}\n[1]\n')
    with pytest.raises(FormatError, match="expected a JSON object"):
        scan(p)


def test_appender_cuts_a_torn_tail_and_appends_whole_chunks(tmp_path):
    p = tmp_path / "sub" / "a.jsonl"
    assert cut_torn_tail(p) == 0
    with Appender(p) as a:
        a.append([{"i": 0}, {"i": 1}])
        a.write({"i": 2})
        assert len(read_records(p)) == 2  # queued, not written before the flush
        a.flush()
    with open(p, "ab") as f:
        f.write(b'{"i": 3')  # a crash mid-append
    with Appender(p) as a:
        a.append([{"i": 3}])
        a.append([])
    assert [r["i"] for r in read_records(p)] == [0, 1, 2, 3] and p.read_bytes().endswith(b"\n")
    with open(p, "ab") as f:
        f.write(b'{"i"')
    assert cut_torn_tail(p) == 4 and cut_torn_tail(p) == 0


def test_locked_refuses_a_second_job(tmp_path):
    p = tmp_path / "a.jsonl"
    with locked(p), pytest.raises(RuntimeError, match="another job"), locked(p):
        pass
    with locked(p):  # released
        pass


def test_the_lock_file_exists_only_while_held(tmp_path):
    """A finished job leaves no ``OUT.lock`` behind; a job that opened the file just before the holder removed it
    locks a fresh one (never a second holder of the same path)."""
    import fcntl
    import os

    p = tmp_path / "out.jsonl"
    with locked(p):
        assert (tmp_path / "out.jsonl.lock").exists()
        fd = os.open(tmp_path / "out.jsonl.lock", os.O_RDWR)  # a second job got the file before the holder is done
    assert not (tmp_path / "out.jsonl.lock").exists()
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # it now holds a lock on the removed file: that is no lock ...
    with locked(p):  # ... and a new job locks the path's new file
        assert (tmp_path / "out.jsonl.lock").exists()
    os.close(fd)
    assert sorted(x.name for x in tmp_path.iterdir()) == []
