"""eval.io: atomic files and directories leave nothing half-written."""

from __future__ import annotations

import os

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


@pytest.mark.parametrize("where", ["check", "swap"])
def test_an_interrupt_once_the_output_is_complete_leaves_no_stage_behind(tmp_path, monkeypatch, where):
    """SIGTERM landing after the job wrote everything, while the output is checked or swapped in: the output is put in
    place first, then the interrupt is raised; no hidden staging folder remains (it did before)."""
    import signal

    import eval.io as io
    import eval.outputs as outputs
    from eval.cli_support import Interrupted, signals_as_exceptions

    out = tmp_path / "report"
    with atomic_dir(out, kind="k") as stage:
        (stage / "a.txt").write_text("first")
    target = (outputs, "check_output_dir") if where == "check" else (io, "_swap_in")
    real, calls = getattr(*target), []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == (2 if where == "check" else 1):  # the check on entry passes; the one after the job is hit
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(*target, interrupted)
    with pytest.raises(Interrupted), signals_as_exceptions(), atomic_dir(out, kind="k") as stage:
        (stage / "b.txt").write_text("second")
    assert len(calls) == (2 if where == "check" else 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no .report.building-* left
    assert sorted(p.name for p in out.iterdir()) == [".psr-output.json", "b.txt"]  # the finished output is in place


def test_atomic_dir_removes_its_stage_when_the_final_check_fails(tmp_path, monkeypatch):
    import eval.outputs as outputs

    out, real, calls = tmp_path / "report", outputs.check_output_dir, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("the disk went away")
        return real(*args, **kwargs)

    monkeypatch.setattr(outputs, "check_output_dir", failing)
    with pytest.raises(OSError, match="went away"), atomic_dir(out, kind="k") as stage:
        (stage / "a.txt").write_text("x")
    assert list(tmp_path.iterdir()) == []


def test_a_held_signal_waits_for_the_block_even_when_another_thread_receives_it():
    """The kernel may hand SIGTERM to any thread (torch's, a library's writer); Python then runs its handler in the
    main thread at once. `signals_held` still defers it to the end of the block, then raises it as the command's
    handler would."""
    import signal
    import threading
    import time

    from eval.atomic import signals_held
    from eval.cli_support import Interrupted, signals_as_exceptions

    before = signal.getsignal(signal.SIGTERM)
    ready, done = threading.Event(), threading.Event()
    other = threading.Thread(target=lambda: (ready.set(), done.wait(10)), daemon=True)
    other.start()
    ready.wait()
    steps = []
    try:
        with pytest.raises(Interrupted), signals_as_exceptions():
            with signals_held():
                signal.pthread_kill(other.ident, signal.SIGTERM)
                time.sleep(0.2)  # the main thread runs pending Python handlers meanwhile
                steps.append("the block finished")
            steps.append("never reached")
    finally:
        done.set()
    assert steps == ["the block finished"]
    assert signal.getsignal(signal.SIGTERM) == before  # every handler swapped in is swapped back


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
