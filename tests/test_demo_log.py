"""`scripts/demo.py`: a rerun of some stages keeps the other stages' commands and seconds in the demo's log."""

from __future__ import annotations

import argparse
import json

from scripts_support import load_script


def _demo_module():
    return load_script("demo")


def test_rerun_of_one_stage_keeps_the_other_stages_log(tmp_path):
    mod = _demo_module()
    path = tmp_path / "demo_log.json"
    first = [{"stage": s, "cmd": f"cmd {s}", "seconds": 1.0} for s in ("data", "retrieval", "distill")]
    path.write_text(json.dumps(first))
    demo = mod.Demo(argparse.Namespace())
    demo.log = [{"stage": "distill", "cmd": "cmd distill again", "seconds": 2.0},
                {"stage": "encoders", "cmd": "cmd encoders", "seconds": 3.0}]
    log = demo.merged_log(path)
    assert [x["stage"] for x in log] == ["data", "encoders", "retrieval", "distill"]  # in stage order
    assert [x["cmd"] for x in log if x["stage"] == "distill"] == ["cmd distill again"]  # the rerun replaces its own
    assert demo.merged_log(tmp_path / "none.json") == sorted(demo.log, key=lambda x: mod.STAGES.index(x["stage"]))


def test_side_by_side_commands_run_at_once_and_a_failure_raises_after_all_finish(tmp_path):
    import subprocess
    import sys

    import pytest

    mod = _demo_module()
    demo = mod.Demo(argparse.Namespace())
    # each command announces itself, then waits for the other's announcement: run one after the other, the first
    # would give up and fail
    meet = ("import sys, time, pathlib; pathlib.Path(sys.argv[1]).touch(); other = pathlib.Path(sys.argv[2]); "
            "end = time.time() + 60\nwhile not other.exists() and time.time() < end: time.sleep(0.05)\n"
            "raise SystemExit(0 if other.exists() else 1)")
    a, b = tmp_path / "a", tmp_path / "b"
    demo.run_side_by_side([[sys.executable, "-c", meet, str(a), str(b)],
                           [sys.executable, "-c", meet, str(b), str(a)]], "encoders")
    assert [x["stage"] for x in demo.log] == ["encoders", "encoders"]
    first, second = (x["started_s"] for x in demo.log)  # the demo's timeline: both started at once
    assert 0 <= first <= second < first + 1.0
    late = tmp_path / "late"
    slow = "import sys, time, pathlib; time.sleep(1.0); pathlib.Path(sys.argv[1]).touch()"
    with pytest.raises(subprocess.CalledProcessError):
        demo.run_side_by_side([[sys.executable, "-c", "raise SystemExit(3)"],
                               [sys.executable, "-c", slow, str(late)]], "encoders")
    assert late.exists()  # the failure waited for its neighbour
    assert len(demo.log) == 4
    demo.run_side_by_side([], "encoders")  # nothing to do
    assert len(demo.log) == 4


def test_commands_are_logged_with_their_cpu_seconds_and_their_children_s(tmp_path):
    import subprocess
    import sys

    import pytest

    mod = _demo_module()
    demo = mod.Demo(argparse.Namespace())
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    # the CPU is spent by a grandchild that the command waits for: it is counted
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}], check=True)"
    demo.run([sys.executable, "-c", parent], "report")
    demo.run_side_by_side([[sys.executable, "-c", "import time; time.sleep(0.5)"],
                           [sys.executable, "-c", spin]], "encoders")
    busy, sleeper, spinner = demo.log
    assert busy["cpu_seconds"] >= 0.4 and spinner["cpu_seconds"] >= 0.4
    assert sleeper["cpu_seconds"] < 0.3 and sleeper["seconds"] >= 0.5
    with pytest.raises(subprocess.CalledProcessError):
        demo.run([sys.executable, "-c", "raise SystemExit(4)"], "report")
    assert len(demo.log) == 3


def test_two_lanes_run_at_once_the_side_lane_writes_its_log_and_failures_wait_for_the_other_lane(tmp_path, capsys):
    import subprocess
    import sys

    import pytest

    mod = _demo_module()
    demo = mod.Demo(argparse.Namespace())
    meet = ("import sys, time, pathlib; print('lane', sys.argv[1]); pathlib.Path(sys.argv[1]).touch(); "
            "other = pathlib.Path(sys.argv[2]); end = time.time() + 60\n"
            "while not other.exists() and time.time() < end: time.sleep(0.05)\n"
            "raise SystemExit(0 if other.exists() else 1)")
    a, b, log = tmp_path / "a", tmp_path / "b", tmp_path / "logs" / "side.log"
    demo.side_by_side(lambda: demo.run([sys.executable, "-c", meet, str(a), str(b)], "data"),
                      lambda: demo.run([sys.executable, "-c", meet, str(b), str(a)], "encoders"), log)
    assert sorted(x["stage"] for x in demo.log) == ["data", "encoders"]
    text = log.read_text()
    assert f"lane {b}" in text and f"lane {a}" not in text and "$ " in text  # the side lane's command and output

    late = tmp_path / "late"
    slow = "import sys, time, pathlib; time.sleep(1.0); pathlib.Path(sys.argv[1]).touch()"
    with pytest.raises(subprocess.CalledProcessError) as err:  # the side lane fails: raised once the main lane ends
        demo.side_by_side(lambda: demo.run([sys.executable, "-c", slow, str(late)], "data"),
                          lambda: demo.run([sys.executable, "-c", "raise SystemExit(5)"], "encoders"), log)
    assert err.value.returncode == 5 and late.exists() and str(log) in err.value.output
    late.unlink()
    with pytest.raises(subprocess.CalledProcessError) as err:  # the main lane fails: raised once the side lane ends
        demo.side_by_side(lambda: demo.run([sys.executable, "-c", "raise SystemExit(6)"], "data"),
                          lambda: demo.run([sys.executable, "-c", slow, str(late)], "encoders"), log)
    assert err.value.returncode == 6 and late.exists()
    with pytest.raises(subprocess.CalledProcessError) as err:  # both fail: the main lane's raises, the side's is said
        demo.side_by_side(lambda: demo.run([sys.executable, "-c", "raise SystemExit(7)"], "data"),
                          lambda: demo.run([sys.executable, "-c", "raise SystemExit(8)"], "encoders"), log)
    assert err.value.returncode == 7 and "the side lane failed too" in capsys.readouterr().out


def test_run_stages_pairs_the_lanes_and_keeps_every_stage_once_in_order(tmp_path):
    import threading

    mod = _demo_module()
    parts = ("forecaster_model", "forecaster_runs", "canon_finetune")

    class Recorder(mod.Demo):
        def __init__(self, args):
            super().__init__(args)
            self.calls = []
            for s in (*mod.STAGES, *parts):
                setattr(self, s, self._stage(s))
            self.towers = self._stage("towers")

        def _stage(self, name):
            def f():
                side = getattr(self.lane, "log", None)
                self.calls.append((name, side.name if side else None, threading.current_thread().name))
            return f

        def side_by_side(self, main, side, side_log):
            self.calls.append(("lanes", side_log.name, None))
            super().side_by_side(main, side, side_log)

    def stages_run(stages, visual="ssl"):
        demo = Recorder(argparse.Namespace(out=tmp_path, visual=visual))
        mod.run_stages(demo, stages)
        return demo.calls

    calls = stages_run(list(mod.STAGES))
    names = [c[0] for c in calls]
    steps = ({*mod.STAGES, *parts} - {"forecaster"})  # the forecaster stage runs in its two parts around a lane
    assert names.count("lanes") == 3 and set(names) - {"lanes"} == steps | {"towers"}
    assert all(names.count(s) == 1 for s in steps)
    side = {c[0]: c[1] for c in calls if c[0] != "lanes"}
    assert side["towers"] == "towers.log" and side["predictability"] == "predictability.log"
    assert side["distill"] == "distill.log"
    assert {s for s, log in side.items() if log is None} == steps - {"predictability", "distill"}
    order = [n for n in names if n in steps]  # the main lane keeps STAGES' order around its side lanes
    assert order.index("data") < order.index("encoders") < order.index("retrieval") \
        < order.index("forecaster_model") < order.index("forecaster_runs") < order.index("report") \
        < order.index("canon")
    assert order.index("report") < order.index("distill")  # beside the canonicalization probes, after the report
    # the canonicalization fine-tune reads only the build: after it, in the main lane beside the towers
    assert order.index("data") < order.index("canon_finetune") < order.index("encoders")
    assert names.index("canon_finetune") < names.index("lanes", names.index("lanes") + 1)
    # the tiny model's fit (both cores) ends before the predictability lane starts
    second_lanes = [i for i, n in enumerate(names) if n == "lanes"][1]
    assert names.index("forecaster_model") < second_lanes < names.index("predictability")
    # a subset: a stage alone runs alone (the forecaster whole); no towers lane without the learned spaces
    assert [c[0] for c in stages_run(["report", "canon"])] == ["report", "canon"]
    assert [c[0] for c in stages_run(["forecaster"])] == ["forecaster"]
    fp = [c[0] for c in stages_run(["forecaster", "predictability"])]
    assert fp[:2] == ["forecaster_model", "lanes"] and sorted(fp[2:]) == ["forecaster_runs", "predictability"]
    assert [c[0] for c in stages_run(["data", "encoders"], visual="pixels")] == ["data", "encoders"]
    de = [c[0] for c in stages_run(["data", "encoders"])]  # no canon stage: no early fine-tune
    assert de[0] == "lanes" and sorted(de[1:3]) == ["data", "towers"] and "canon_finetune" not in de
    assert [c[0] for c in stages_run(["report", "predictability"])] == ["report", "predictability"]
    cd = stages_run(["canon", "distill"])
    assert cd[0][:2] == ("lanes", "distill.log") and sorted(c[0] for c in cd[1:]) == ["canon", "distill"]
    assert [c[0] for c in stages_run(["distill"])] == ["distill"]


def test_report_tests_against_the_fusion_chosen_on_validation_and_pairs_the_other_fusion(tmp_path, monkeypatch):
    """The report's reference is the headline fusion that `runs/fusion_selection.json` records (chosen on validation);
    the fusion that is not the headline is tested against the single head best on validation; without the record,
    the reference is the fusion of the fewest spaces."""
    import numpy as np

    from eval.runs import Run, write_run

    mod = _demo_module()
    runs = tmp_path / "runs"
    runs.mkdir()
    names = {"lftr-minilm-seed0": "lftr[minilm]-seed0", "lftr-lit-seed0": "lftr[lit]-seed0",
             **{f"lftr-fusion-{f}-seed{s}": f"lftr-fusion[{f}]-seed{s}" for f in ("minilm+lit", "minilm+ssl+lit+pixels")
                for s in (0, 1)}}
    for stem, name in names.items():
        write_run(runs / f"{stem}.parquet", Run(method=name, config={}, query_ids=["q"], topk_ids=[["a"]],
                                                 topk_scores=np.zeros((1, 1)), stats={}, benchmark="b", name=name))
    demo = mod.Demo(argparse.Namespace(out=tmp_path, seeds=2, visual="ssl", data=tmp_path / "data"))
    paths = [str(p) for p in sorted(runs.glob("*.parquet"))]
    assert demo.reference(paths) == "lftr-fusion[minilm+lit]-seed0"  # no record: the fewest spaces
    sel = {"chosen": "lit", "headline": ["minilm", "ssl", "lit", "pixels"],
           "fusions_val_R@5": {"minilm+lit": 0.030, "minilm+ssl+lit+pixels": 0.033},
           "singles_val_R@5": {"minilm": 0.019, "ssl": 0.005, "lit": 0.009, "pixels": 0.004}, "seed": 0}
    (runs / "fusion_selection.json").write_text(json.dumps(sel))
    assert demo.reference(paths) == "lftr-fusion[minilm+ssl+lit+pixels]-seed0"
    seen = []
    monkeypatch.setattr(demo, "run", lambda cmd, stage: seen.append(cmd))
    demo.report()
    cmd = seen[0]
    assert cmd[cmd.index("--reference") + 1] == "lftr-fusion[minilm+ssl+lit+pixels]-seed0"
    pairs = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--pair"]
    assert "lftr-fusion[minilm+lit]-seed0:lftr[minilm]-seed0" in pairs
    sel["headline"] = ["minilm", "lit"]
    (runs / "fusion_selection.json").write_text(json.dumps(sel))
    assert demo.reference(paths) == "lftr-fusion[minilm+lit]-seed0"
    seen.clear()
    demo.report()
    assert "lftr-fusion[minilm+ssl+lit+pixels]-seed0:lftr[minilm]-seed0" in [
        seen[0][i + 1] for i, x in enumerate(seen[0]) if x == "--pair"]
    assert demo.selection_line() is None  # no pair's validation R@5 recorded: nothing to say
    sel["val_R@5"] = {"ssl": 0.0278, "lit": 0.0301, "pixels": 0.0235}
    sel["headline"] = ["minilm", "ssl", "lit", "pixels"]
    (runs / "fusion_selection.json").write_text(json.dumps(sel))
    line = demo.selection_line()
    assert "the pair `minilm+lit`" in line and "ssl 2.78, lit 3.01, pixels 2.35" in line
    assert "`minilm+ssl+lit+pixels` (validation R@5 3.30, against `minilm+lit` 3.00)" in line
    sel["chosen"] = "depth"  # a record this demo did not write: no pair of that space among its fusions
    (runs / "fusion_selection.json").write_text(json.dumps(sel))
    assert demo.selection_line() is None
    # the fusion through the perceiver: tested against the perceiver's semantic head on its first seed and, like the
    # headline, against the single heads on the seed means
    assert demo.perceiver_selection_line() is None
    (runs / "fusion_selection_perceiver.json").write_text(json.dumps(
        {"chosen": "pixels", "val_R@5": {"ssl": 0.0358, "pixels": 0.0508}, "singles_val_R@5": {"minilm": 0.0328}}))
    seen.clear()
    demo.report()
    pairs = [seen[0][i + 1] for i, x in enumerate(seen[0]) if x == "--pair"]
    assert {"lftr-perceiver-fusion[minilm+pixels]-seed0:lftr-perceiver[minilm]-seed0",
            "lftr-perceiver-fusion[minilm+pixels]:lftr-perceiver[minilm]",
            "lftr-perceiver-fusion[minilm+pixels]:lftr[minilm]",
            "lftr-fusion[minilm+ssl+lit+pixels]:lftr-perceiver[minilm]",
            "lftr-fusion[minilm+ssl+lit+pixels]:lftr[minilm]"} <= set(pairs)
    line = demo.perceiver_selection_line()
    assert "`minilm+pixels` (validation R@5 of each visual space's pair: ssl 3.58, pixels 5.08" in line
    demo.args.seeds = 1  # one seed: no seed means, and the runs carry no seed suffix
    assert demo.seed_mean_pairs(sel, sel["singles_val_R@5"]) == [
        "--pair", "lftr-perceiver-fusion[minilm+pixels]:lftr-perceiver[minilm]"]


def test_cost_summary_sums_each_stage_and_bounds_the_wall_by_the_cpu_work():
    mod = _demo_module()
    log = [{"stage": "data", "seconds": 100, "cpu_seconds": 90.0},
           {"stage": "data", "seconds": 10, "cpu_seconds": 30.0},
           {"stage": "retrieval", "seconds": 500, "cpu_seconds": 1080.0},
           {"stage": "canon", "seconds": 5}]  # an older log without CPU seconds
    lines = mod.cost_summary(log, cpus=2)
    assert "| data | 110 | 120 | 10% |" in lines and "| retrieval | 500 | 1,080 | 90% |" in lines
    assert "| canon | 5 | 0 | 0% |" in lines
    assert lines[-1].startswith("1,200 CPU s in all: on 2 CPUs this work takes at least 10.0 min")
    assert mod.cost_summary([{"stage": "data", "seconds": 3}], cpus=2) == []


def test_the_results_page_names_the_precision_each_lftr_head_trained_in(tmp_path):
    mod = _demo_module()
    assert mod.lftr_precisions(tmp_path) == ""
    for name, info in (("lftr-minilm-seed0", {"precision": "bf16"}), ("lftr-pixels-seed0", {"precision": "bf16"}),
                       ("lftr-ssl-seed0", {})):  # a head trained before the key: float32
        (tmp_path / name).mkdir()
        (tmp_path / name / "train_info.json").write_text(json.dumps(info))
    said = mod.lftr_precisions(tmp_path)
    assert said.endswith(": 2 in bf16; 1 in fp32.") and "configs/lftr/synth.yaml" in said
