"""Measurement records (`eval.measured`), the page built from them (`scripts/perf_page.py`), `scripts/time_command.py`
and a benchmark's record (`scripts/bench_load.py` at a small scale)."""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path

import pytest

from eval import measured
from eval.io import FormatError

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ["bench_load", "bench_scoring", "bench_fusion", "bench_lftr", "bench_likelihood", "bench_runner",
              "bench_encoders", "bench_canon", "bench_synth", "bench_train_load", "psr_scale", "bench_lftr_step",
              "bench_lftr_val"]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"_script_{name}", ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their annotations through it
    spec.loader.exec_module(mod)
    return mod


def test_record_round_trip(tmp_path):
    rec = measured.record("bench_x", title="X", markdown="| a |\n|---|\n| 1 |", data={"a": 1.5}, folder=tmp_path,
                          load=(1.234, 2.5), argv=["scripts/bench_x.py", "--out", "a b"])
    assert rec.path == tmp_path / "bench_x.json"
    (back,) = measured.load(tmp_path)
    assert back == rec and back.path == rec.path
    assert back.command == "python scripts/bench_x.py --out 'a b'"
    assert back.markdown == "| a |\n|---|\n| 1 |\n" and back.data == {"a": 1.5}
    assert (back.load_before, back.load_after) == (1.23, 2.5)
    assert back.cpus >= 1 and back.cpu_model and back.measured_at.endswith("+00:00")
    assert back.commit is None or len(back.commit.removesuffix("+dirty")) == 40
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # atomic: no temporary file left


def test_record_reads_the_load_itself_and_refuses_a_bad_name(tmp_path):
    rec = measured.record("plain", title="t", markdown="m", folder=tmp_path)
    assert rec.load_before == rec.load_after >= 0 and rec.data is None
    with pytest.raises(ValueError, match="record name"):
        measured.record("../escape", title="t", markdown="m", folder=tmp_path)


def test_load_names_a_file_that_is_not_a_record(tmp_path):
    assert measured.load(tmp_path / "missing") == []
    (tmp_path / "x.json").write_text(json.dumps({"name": "x"}))
    with pytest.raises(FormatError, match=r"x\.json.*missing"):
        measured.load(tmp_path)


def test_command_line_is_written_as_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert measured.command_line([str(tmp_path / "scripts" / "b.py"), "--n", "3"]) == "python scripts/b.py --n 3"
    assert measured.command_line(["/elsewhere/b.py"]) == "python /elsewhere/b.py"


def test_perf_page_renders_a_section_from_its_record_and_not_measured_without(tmp_path):
    page = _script("perf_page")
    measured.record("bench_load", title="Loading, measured", markdown="### inner\n\n| step | seconds |\n|---|---:|\n"
                    "| load | 1.25 |", folder=tmp_path, load=(0.5, 0.75), argv=["scripts/bench_load.py"])
    text = page.render(measured.load(tmp_path))
    assert "`python scripts/perf_page.py`" in text.split("## ")[0] and "never edited by hand" in text
    loading = text.split("## Loading a benchmark")[1].split("\n## ")[0]
    assert "### Loading, measured" in loading and "`python scripts/bench_load.py`" in loading
    assert "| load | 1.25 |" in loading and "#### inner" in loading  # the record's heading sits under its own
    assert "load average 0.5 before, 0.8 after" in loading and "Not measured" not in loading
    scoring = text.split("## Scoring at PSR scale")[1].split("\n## ")[0]
    assert "Not measured for this version: run\n\n- `python scripts/bench_scoring.py" in scoring
    for s in page.SECTIONS:  # the contents link every section
        assert f"- [{s.title}](#{page.anchor(s.title)})" in text and f"\n## {s.title}\n" in text
    assert page.anchor("Setup, tests and the demo") == "setup-tests-and-the-demo"


def test_perf_page_keeps_an_unclaimed_record_and_checks(tmp_path):
    page = _script("perf_page")
    measured.record("something_new", title="New", markdown="x", folder=tmp_path / "r")
    out = tmp_path / "performance.md"
    assert page.main(["--records", str(tmp_path / "r"), "--out", str(out)]) == 0
    assert "## Other measurements" in out.read_text() and "### New" in out.read_text()
    assert page.main(["--records", str(tmp_path / "r"), "--out", str(out), "--check"]) == 0
    out.write_text(out.read_text() + "hand edit\n")
    assert page.main(["--records", str(tmp_path / "r"), "--out", str(out), "--check"]) == 1


def test_time_command_passes_the_exit_code_through(tmp_path, capsys):
    tc = _script("time_command")
    rc = tc.main(["tiny", "--record-dir", str(tmp_path), "--", sys.executable, "-c",
                  "print('hello'); raise SystemExit(3)"])
    assert rc == 3 and "hello" in capsys.readouterr().out
    (rec,) = measured.load(tmp_path)
    assert rec.name == "tiny" and rec.data["exit_code"] == 3 and rec.data["pytest_summary"] is None
    assert rec.command.startswith("python scripts/time_command.py tiny --record-dir")
    assert "| 3 |" in rec.markdown and rec.data["wall_s"] > 0
    assert tc.main(["quiet", "--no-record", "--", sys.executable, "-c", "pass"]) == 0
    assert [r.name for r in measured.load(tmp_path)] == ["tiny"]


def test_time_command_without_a_command_says_how(capsys):
    with pytest.raises(SystemExit) as e:
        _script("time_command").main(["name-only"])
    assert e.value.code == 2 and "after '--'" in capsys.readouterr().err


def test_time_command_records_the_pytest_summary(tmp_path):
    tc = _script("time_command")
    test = tmp_path / "test_tiny.py"
    test.write_text("def test_ok():\n    assert True\n\n\ndef test_bad():\n    assert False\n")
    rc = tc.main(["tiny-pytest", "--record-dir", str(tmp_path / "r"), "--", sys.executable, "-m", "pytest", "-q",
                  "-p", "no:cacheprovider", str(test)])
    assert rc == 1
    (rec,) = measured.load(tmp_path / "r")
    assert rec.data["pytest_summary"].startswith("1 failed, 1 passed in ")
    assert f"pytest: {rec.data['pytest_summary']}" in rec.markdown


def test_time_command_records_each_pytest_run_of_the_command(tmp_path):
    tc = _script("time_command")
    (tmp_path / "test_a.py").write_text("def test_ok():\n    assert True\n")
    (tmp_path / "test_b.py").write_text("def test_bad():\n    assert False\n")
    pytest_cmd = f"{shlex.quote(sys.executable)} -m pytest -q -p no:cacheprovider"
    script = f"{pytest_cmd} {tmp_path / 'test_a.py'}; {pytest_cmd} {tmp_path / 'test_b.py'}"
    rc = tc.main(["two-runs", "--record-dir", str(tmp_path / "r"), "--", "bash", "-c", script])
    assert rc == 1
    (rec,) = measured.load(tmp_path / "r")
    first, second = rec.data["pytest_summary"].split("; ")
    assert first.startswith("1 passed in ") and second.startswith("1 failed in ")


@pytest.mark.parametrize("line, summary", [
    ("==== 938 passed, 10 skipped, 2 warnings in 647.12s (0:10:47) ====", "938 passed, 10 skipped, 2 warnings in "
                                                                         "647.12s (0:10:47)"),
    ("3 passed in 0.01s", "3 passed in 0.01s"),
    ("1 failed, 2 errors in 1.5s", "1 failed, 2 errors in 1.5s"),
    ("collected 3 items", None),
])
def test_pytest_summary_line(line, summary):
    assert _script("time_command").pytest_summary(f"noise\n{line}\n") == summary


def test_bench_load_records_its_table(tmp_path, capsys):
    bl = _script("bench_load")
    bl.main(["--scale", "0.002", "--record-dir", str(tmp_path)])
    printed = capsys.readouterr().out
    (rec,) = measured.load(tmp_path)
    assert rec.name == "bench_load_scale0.002" and rec.command == (
        f"python scripts/bench_load.py --scale 0.002 --record-dir {tmp_path}")
    assert rec.markdown in printed and "| bare json.loads of every line (baseline) |" in rec.markdown
    assert rec.data["shape"]["queries"] == 40 and len(rec.data["steps"]) == 8


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_records(name):
    """Each benchmark script offers --record-dir / --no-record and records (read from its source: importing some of
    them loads torch)."""
    src = (ROOT / "scripts" / f"{name}.py").read_text(encoding="utf-8")
    assert "add_record_options(" in src and "record_from_args(" in src


def test_bench_train_load_reads_per_epoch_and_per_step_costs(tmp_path):
    """The tower / LFTR history (one line per epoch) and distill.train's log (cumulative ``cpu_s`` / ``wall_s`` per
    logged step, eval entries among them) both give the seconds of each epoch or optimizer step."""
    btl = _script("bench_train_load")
    hist = tmp_path / "history.jsonl"
    hist.write_text("\n".join(json.dumps({"train_cpu_seconds": c, "train_seconds": w, "load_avg": 1.0})
                              for c, w in [(9.0, 5.0), (7.0, 4.0)]) + "\n")
    assert btl.per_epoch(hist, "train_") == ([9.0, 7.0], [5.0, 4.0], [1.0, 1.0])
    log = tmp_path / "train_log.json"
    log.write_text(json.dumps([{"loss": 2.0, "step": 1, "cpu_s": 3.0, "wall_s": 2.0},
                               {"eval_loss": 1.9, "step": 1, "cpu_s": 3.5, "wall_s": 2.2},
                               {"loss": 1.8, "step": 3, "cpu_s": 4.0, "wall_s": 3.0},
                               {"loss": 1.7, "step": 4, "cpu_s": 4.25, "wall_s": 3.25}]))
    cpu, wall, loads = btl.per_epoch(log, "")
    assert cpu == [3.0, 0.5, 0.25] and wall == [2.0, 0.5, 0.25] and loads == [None] * 3


def test_cpu_model_names_the_widest_vector_instructions():
    def info(name: str, flags: str) -> str:
        core = f"processor\t: {{}}\nmodel name\t: {name}\nflags\t\t: fpu sse2 {flags}\n\n"
        return core.format(0) + core.format(1)

    assert measured.cpu_model(info("AMD EPYC", "avx avx2 fma")) == "AMD EPYC (AVX2)"
    assert measured.cpu_model(info("AMD EPYC", "avx avx2 avx512f avx512_bf16")) == "AMD EPYC (AVX-512, BF16)"
    xeon = info("Intel(R) Xeon(R) Processor", "avx avx2 avx512f avx512_bf16 amx_tile")
    assert measured.cpu_model(xeon) == "Intel(R) Xeon(R) Processor (AVX-512, BF16, AMX)"
    assert measured.cpu_model(info("Old", "sse4_2")) == "Old"  # nothing to add
    assert measured.cpu_model()  # this machine's
