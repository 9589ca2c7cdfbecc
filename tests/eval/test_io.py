"""eval.io: atomic files and directories leave nothing half-written."""

from __future__ import annotations

import pytest

from eval.io import FormatError, atomic_dir, iter_jsonl


def test_atomic_dir_replaces_on_success_and_keeps_old_on_failure(tmp_path):
    out = tmp_path / "report"
    with atomic_dir(out, kind="k") as stage:
        (stage / "a.txt").write_text("first")
    assert (out / "a.txt").read_text() == "first"
    with pytest.raises(RuntimeError), atomic_dir(out, kind="k") as stage:
        (stage / "b.txt").write_text("half")
        raise RuntimeError("job failed")
    assert sorted(p.name for p in out.iterdir()) == [".psr-output.json", "a.txt"]  # the previous output is untouched
    with atomic_dir(out, kind="k") as stage:
        (stage / "c.txt").write_text("second")
    assert sorted(p.name for p in out.iterdir()) == [".psr-output.json", "c.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no stage or old directory left behind
    assert out.stat().st_mode & 0o044  # readable by others like any output (mkdtemp would make it private)


def test_iter_jsonl_names_the_bad_line_and_tolerates_a_torn_tail(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert [o["a"] for _, o in iter_jsonl(p, allow_torn_tail=True)] == [1, 2]
    with pytest.raises(FormatError, match=r"x.jsonl:3"):
        list(iter_jsonl(p))
    p.write_text('{"a": 1}\n[1]\n')
    with pytest.raises(FormatError, match=r"x.jsonl:2: expected a JSON object"):
        list(iter_jsonl(p))


def test_read_yaml_names_the_file_and_line(tmp_path):
    from eval.io import FormatError, read_yaml

    p = tmp_path / "c.yaml"
    p.write_text("a: 1\nb: [2\n")
    with pytest.raises(FormatError, match=r"c.yaml.*not valid YAML"):
        read_yaml(p)
    p.write_text("")
    assert read_yaml(p) == {}
    p.write_text("a: 1\n")
    assert read_yaml(p) == {"a": 1}
