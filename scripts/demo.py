"""`make demo`: the toolkit's main job on the embedded default (the synthetic benchmark), end to end on CPU.

Stages, each a command of a package (the demo doubles as a worked example; every command is logged):
  1. data       build the synthetic benchmark the paper's way (`python -m retrieval synth`: simulate, then canonicalize,
                mine and verify the GT; reused when --data already holds the same build), validate it and write its
                card (OUT/card/);
  2. encoders  the synthetic world's own frozen encoders, pretrained once on a world the benchmark never shows
                (`eval synth` with another seed -> DATA-tower-world/, its train split; this pretraining runs beside
                stage 1, its output in OUT/logs/towers.log) and reused on rerun: the
                self-supervised visual tower (`retrieval encoder ssl`, the DINOv2 role) and the LiT text -> image tower
                (`retrieval encoder lit`, the CLIP role, MiniLM locked) -> OUT/encoders/; each is checked to share no
                video with the benchmark, then `retrieval encode` writes their spaces `ssl` and `lit` into the
                benchmark's features/ (the two encodes side by side);
  3. retrieval  encode the semantic space (packaged MiniLM), every baseline (incl. the lookup prior), every oracle
                (incl. the held-out paraphrase oracle and LiT's zero-shot text -> image oracle), LFTR in the semantic,
                the SSL, the LiT and the raw `pixels` space (and in SSL from the last prefix frame only: 8 vs 1
                frames), the z-score fusions (semantic + visual; + LiT) and the complementarity analysis
                -> OUT/runs/ (`--visual pixels` runs the demo on the raw pixels space without towers);
  4. forecaster plumbing check: a tiny locally built model runs the text-only forecaster over the test split through
                the hf backend, its phrases are retrieved and scored like any predictor (labelled as plumbing: its
                numbers say nothing about forecasting);
  5. report     `python -m eval report` over all runs: main / horizon / question type / tier / GT-definition tables,
                significance against the headline LFTR fusion (chosen on validation by stage 3), the paired tests
                learned visual space vs pixels, state prototype vs independent appearance and the other fusion vs
                the best single head on validation, plots -> OUT/report/;
  6. canon      canonicalization probes: threshold sweep, re-keying, paraphrase oracle, description probe,
                canonicalize-then-retrieve and the paraphrase-robust encoder -> OUT/canon/ (the encoder's fine-tune
                runs early, after stage 1 and beside the towers' pretraining);
  7. distill    the distillation recipe on CPU with the perception-solved student (`DISTILL_PRESET`: the simulator's
                evidence as text, a tiny causal LM, three students x 3 seeds x 2 budgets on the closed slice of the 50
                most frequent target states, faithfulness, the validator's catch rates) -> OUT/distill/, beside
                stage 6 (its output in OUT/logs/distill.log); its section of the results page is
                `distill.results.section`.
OUT/README.md indexes the outputs. Stages skip work whose outputs exist (rerun with --force to redo them).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file: the page's findings come from this checkout's packages, not from
    sys.path.insert(0, str(ROOT))  # whatever checkout the environment's editable install points at
STAGES = ("data", "encoders", "retrieval", "forecaster", "report", "predictability", "canon", "distill")
SEMANTIC = "minilm"
#: the demo's tower configs (configs/encoders/); the towers land in OUT/encoders/<space>/
TOWER_CONFIGS = {name: ROOT / "configs" / "encoders" / f"{name}-demo.yaml" for name in ("ssl", "lit", "perceiver")}
#: videos of the towers' pretraining world (simulated with `retrieval.towers.pretraining_world_seed` of the demo's seed)
TOWER_WORLD_VIDEOS = 900
#: The supervised perceiver's directory under encoders/ and its prefix space's name (`retrieval.perceiver`).
PERCEIVER = "perceiver"
PLUMBING_METHOD = "text-only (tiny model, plumbing check)"
#: the distill stage's preset (configs/distill/): the perception-solved student on CPU
DISTILL_PRESET = "configs/distill/evidence-cpu.yaml"


def wait_cpu(proc: subprocess.Popen) -> tuple[int, float]:
    """Wait for ``proc`` -> (its exit code, its CPU seconds: user + system time of it and of the processes it waited
    for, every thread counted)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


class Demo:
    def __init__(self, args: argparse.Namespace):
        self.args, self.log = args, []
        self.t_start = time.time()  # each logged command's start is an offset from here (the demo's timeline)
        self.lane = threading.local()  # .log: the file a side lane's commands write to (`side_by_side`)
        self.towers_ready = False
        self.finetuned = False  # `canon_finetune` ran in this call
        self.cost: list[str] = []  # `cost_summary` of the commands, once `index` wrote it

    def run(self, cmd: list[str], stage: str) -> None:
        log = getattr(self.lane, "log", None)
        print(f"\n[{stage}] $ {shlex.join(cmd)}" + (f"  (output: {log})" if log else ""), flush=True)
        t0 = time.time()
        if log is None:
            rc, cpu = wait_cpu(subprocess.Popen(cmd, cwd=ROOT))
        else:
            with open(log, "a", encoding="utf-8") as f:
                f.write(f"\n$ {shlex.join(cmd)}\n")
                f.flush()
                rc, cpu = wait_cpu(subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT))
        if rc:
            raise subprocess.CalledProcessError(rc, cmd, output=f"see {log}" if log else None)
        self.logged(stage, cmd, t0, cpu)

    def side_by_side(self, main: Callable[[], None], side: Callable[[], None], side_log: Path) -> None:
        """Run two lanes of this demo's commands at once, each in its own thread: ``main`` on the console and
        ``side`` with its commands' output in ``side_log``. Both are waited for; then the first failure raises."""
        side_log.parent.mkdir(parents=True, exist_ok=True)

        def lane() -> None:
            self.lane.log = side_log
            side()

        with ThreadPoolExecutor(1) as ex:
            other = ex.submit(lane)
            try:
                main()
            except BaseException:
                if other.exception() is not None:  # waits for the side lane; its failure is said, the main one raised
                    print(f"\nthe side lane failed too: {other.exception()} (output: {side_log})", flush=True)
                raise
        if other.exception() is not None:
            raise other.exception()

    def logged(self, stage: str, cmd: list[str], t0: float, cpu: float) -> None:
        self.log.append({"stage": stage, "cmd": shlex.join(cmd), "started_s": round(t0 - self.t_start, 1),
                         "seconds": round(time.time() - t0, 1), "cpu_seconds": round(cpu, 1)})

    def run_side_by_side(self, cmds: list[list[str]], stage: str) -> None:
        """Run ``cmds`` at once (mostly single-threaded commands: they share the CPUs); each is logged with its own
        seconds. Every one is waited for; then the first that failed raises."""
        procs = []
        for cmd in cmds:
            print(f"\n[{stage}] $ {shlex.join(cmd)} &", flush=True)
            procs.append((cmd, time.time(), subprocess.Popen(cmd, cwd=ROOT)))
        failed = None
        for cmd, t0, proc in procs:
            rc, cpu = wait_cpu(proc)
            self.logged(stage, cmd, t0, cpu)
            if rc and failed is None:
                failed = subprocess.CalledProcessError(rc, cmd)
        if failed is not None:
            raise failed

    def data(self) -> None:
        a = self.args
        self.run([PY, "-m", "retrieval", "synth", "--out", str(a.data), "--preset", a.preset, "--seed", str(a.seed)],
                 "data")
        self.run([PY, "-m", "eval", "validate", str(a.data)], "data")
        self.run([PY, "-m", "eval", "card", str(a.data), "--out", str(a.out / "card")], "data")

    @property
    def learned(self) -> bool:
        return self.args.visual == "ssl"

    def encoders(self) -> None:
        """Simulate the towers' pretraining world (another seed), train the SSL tower and the LiT tower (started from
        it) once on its train split and the supervised perceiver on all of it, check that none read a video of the
        benchmark, and encode their spaces (the perceiver's: a prefix space)."""
        if not self.learned:
            return
        from eval.benchmark import Benchmark
        from retrieval.towers import check_disjoint

        a, models = self.args, self.args.out / "encoders"
        self.towers()
        bench = Benchmark.load(a.data)
        todo = []
        for space in ("ssl", "lit", PERCEIVER):
            d = check_disjoint(models / space, bench)  # raises when the tower read a video of the benchmark
            print(f"[encoders] {space}: {d['tower_videos']} pretraining videos, none of the benchmark's "
                  f"{d['benchmark_videos']}")
            if self.encoded(space, models / space):
                print(f"[encoders] features/{space} already encodes {models / space}: reused")
                continue
            todo.append([PY, "-m", "retrieval", "encode", "--data", str(a.data), "--space", space, "--model",
                         str(models / space)])
        self.run_side_by_side(todo, "encoders")  # an encode decodes frames on one core most of the time

    def towers(self) -> None:
        """The towers' pretraining: their world (another simulation) and the SSL tower, the LiT tower and the
        supervised perceiver trained on it. It reads nothing of the benchmark, so `main` runs it beside the data
        stage."""
        from retrieval.towers import pretraining_world_seed

        if self.towers_ready:
            return
        a, models = self.args, self.args.out / "encoders"
        world, seed = a.data.with_name(a.data.name + "-tower-world"), pretraining_world_seed(a.seed)
        if a.force or not self.world_ready(world, seed, a.preset):
            self.run([PY, "-m", "eval", "synth", "--out", str(world), "--preset", a.preset, "--seed", str(seed),
                      "--videos", str(TOWER_WORLD_VIDEOS)], "encoders")
        self.run([PY, "-m", "retrieval", "encoder", "ssl", "--data", str(world), "--out", str(models / "ssl"),
                  "--config", str(TOWER_CONFIGS["ssl"])], "encoders")
        self.run([PY, "-m", "retrieval", "encoder", "lit", "--data", str(world), "--out", str(models / "lit"),
                  "--config", str(TOWER_CONFIGS["lit"]), "--init", str(models / "ssl")], "encoders")
        self.run([PY, "-m", "retrieval", "encoder", "perceiver", "--data", str(world), "--out",
                  str(models / PERCEIVER), "--config", str(TOWER_CONFIGS["perceiver"])], "encoders")
        self.towers_ready = True

    @staticmethod
    def world_ready(world: Path, seed: int, preset: str) -> bool:
        """``world`` already holds the towers' pretraining world of ``seed`` and ``preset`` (a finished `eval synth`
        build of `TOWER_WORLD_VIDEOS` videos)."""
        try:
            extra = json.loads((world / "manifest.json").read_text()).get("extra", {})
        except (OSError, ValueError):
            return False
        return (extra.get("seed"), extra.get("preset"), extra.get("videos")) == (seed, preset, TOWER_WORLD_VIDEOS)

    def encoded(self, space: str, tower: Path) -> bool:
        """features/<space> is complete and was encoded by this tower after it finished training."""
        d = self.args.data / "features" / space
        from retrieval.towers import TRAIN_RECORD

        meta, done, record = d / "meta.json", d / "encode_config.json", tower / TRAIN_RECORD
        if not (meta.exists() and done.exists() and record.exists()) or self.args.force:
            return False
        return (json.loads(meta.read_text()).get("model") == str(tower)
                and done.stat().st_mtime > record.stat().st_mtime)

    def retrieval(self) -> None:
        spaces = (["--visual-space", "ssl", "--extra-space", "lit", "--compare-space", "pixels",
                   "--perceived-space", PERCEIVER] if self.learned else ["--visual-space", "pixels"])
        seeds = [x for s in range(self.args.seeds) for x in ("--seeds", str(s))]
        self.run([PY, "-m", "retrieval", "demo", "--data", str(self.args.data), "--out", str(self.runs),
                  "--semantic-space", SEMANTIC, *spaces, *seeds], "retrieval")

    def forecaster(self) -> None:
        self.forecaster_model()
        self.forecaster_runs()

    @property
    def tiny_model(self) -> Path:
        return self.args.out / "forecaster" / "tiny-qwen2"

    def forecaster_model(self) -> None:
        """The plumbing check's tiny model, fitted on the benchmark's texts (torch on both cores)."""
        a, model = self.args, self.tiny_model
        if not (model / "config.json").exists() or a.force:
            self.run([PY, "-m", "forecasters", "tiny-model", "--out", str(model), "--kind", "qwen2",
                      "--fit-data", str(a.data), "--fit-steps", "100"], "forecaster")

    def forecaster_runs(self) -> None:
        """The tiny model's text-only forecaster over the test split, and its phrases retrieved (one core)."""
        a, out, model = self.args, self.args.out / "forecaster", self.tiny_model
        phrases = out / "text-only-tiny.jsonl"
        self.run([PY, "-m", "forecasters", "run", "--data", str(a.data), "--split", "test", "--forecaster", "text-only",
                  "--backend", "hf", "--model", str(model), "--out", str(phrases), "--num-threads", "1",
                  "--batch-size", "64"], "forecaster")
        self.run([PY, "-m", "retrieval", "search", "--data", str(a.data), "--phrases", str(phrases), "--space", "minilm",
                  "--method", PLUMBING_METHOD, "--out", str(self.runs / "text-only-tiny.parquet")], "forecaster")

    def predictability(self) -> None:
        """The world's predictability ceiling: each test query's video re-simulated with a perturbation just after
        its prefix (`eval.synth.predictability`)."""
        a = self.args
        self.run([PY, "-m", "eval", "predictability", "--data", str(a.data), "--out", str(a.out / "predictability")],
                 "predictability")

    #: Table order: naive baselines, the forecaster plumbing check, learned methods, then the oracles (ceilings).
    ORDER = ("random", "question-only", "lookup", "persistence", "zero-shot", "knn-future", "text-only", "lftr-minilm",
             "lftr-ssl", "lftr-lit", "lftr-pixels", "lftr-ssl-last", "lftr-pixels-last", "lftr-perceiver",
             "lftr-fusion",
             "transition-table", "lftr-sim", "state-classifier", "oracle-independent-appearance", "oracle-state-prototype",
             "oracle-paraphrase", "oracle-semantic-text")

    def report(self) -> None:
        def rank(p: Path) -> tuple[int, str]:
            hits = [i for i, prefix in enumerate(self.ORDER) if p.stem.startswith(prefix)]
            return (hits[-1] if hits else len(self.ORDER), p.stem)

        runs = [str(p) for p in sorted(self.runs.glob("*.parquet"), key=rank)]
        pairs = []
        if self.learned:  # the learned visual space against raw pixels, and the SSL space's prototype ceiling
            s = "-seed0" if self.args.seeds > 1 else ""  # with several seeds, the pair test reads the first seed's runs
            pairs = ["--pair", f"lftr[ssl]{s}:lftr[pixels]{s}", "--pair",
                     "oracle-state-prototype[ssl]:oracle-independent-appearance[ssl]"]
            # LFTR from frames through the supervised perceiver against LFTR from the SSL tower, into the same space
            pairs += ["--pair", f"lftr-{PERCEIVER}[{SEMANTIC}]{s}:lftr[{SEMANTIC}]{s}"]
            # the fusion that is not the headline against the single head best on validation (the headline meets
            # every single head as the tests' reference)
            sel = self.fusion_selection()
            others = [f for f in sel.get("fusions_val_R@5", {}) if f != "+".join(sel.get("headline", []))]
            singles = sel.get("singles_val_R@5", {})
            if others and singles:
                best = max(singles, key=singles.get)
                pairs += ["--pair", f"lftr-fusion[{others[0]}]{s}:lftr[{best}]{s}"]
            pairs += self.seed_mean_pairs(sel, singles)
        card = self.args.out / "card" / "card.json"  # the horizon-shares plot shows the card's shares beside the runs'
        self.run([PY, "-m", "eval", "report", *runs, "--data", str(self.args.data), "--out", str(self.args.out / "report"),
                  "--reference", self.reference(runs), *pairs, *(["--card", str(card)] if card.exists() else [])],
                 "report")

    def canon_finetune(self) -> None:
        """The canonicalization probes' fine-tune (and its space), which reads only the benchmark: `run_stages` runs
        it after the build, beside the towers' pretraining; `canon` then reuses it."""
        a = self.args
        self.run([PY, "scripts/canon_probes.py", "--data", str(a.data), "--out", str(a.out / "canon"),
                  "--finetune-only", *(["--force"] if a.force else [])], "canon")
        self.finetuned = True

    def canon(self) -> None:
        a = self.args
        cmd = [PY, "scripts/canon_probes.py", "--data", str(a.data), "--out", str(a.out / "canon")]
        lftr = [p for p in sorted(self.runs.glob("lftr*.parquet"))]
        for p in lftr:
            cmd += ["--predictor", str(p)]
        force = (["--force"] + (["--keep-finetune"] if self.finetuned else [])) if a.force else []
        self.run(cmd + force, "canon")

    def distill(self) -> None:
        self.run(["bash", "scripts/distill.sh", "--cpu-demo", "--config", DISTILL_PRESET, "--out",
                  str(self.args.out / "distill"), "--data", str(self.args.data)], "distill")

    @property
    def runs(self) -> Path:
        return self.args.out / "runs"

    def reference(self, runs: list[str]) -> str:
        """The reference of the significance tests: the headline LFTR fusion, which the retrieval stage chose on
        validation (`runs/fusion_selection.json`: the better of the two-space fusion and the fusion of every target
        space; its first seed's run); without that record, the fusion of the fewest spaces (the paper's headline is a
        two-space fusion), else the first run."""
        import pyarrow.parquet as pq

        names = {}
        for r in runs:
            meta = json.loads(pq.read_schema(r).metadata[b"psr_run"])
            names[Path(r).stem] = meta.get("name") or meta["method"]
        sel = self.fusion_selection()
        if sel.get("headline"):
            stem = "lftr-fusion-" + "+".join(sel["headline"])
            for s in (f"{stem}-seed{sel.get('seed', 0)}", stem):
                if s in names:
                    return names[s]
        fused = [n for stem, n in names.items() if "fusion" in stem or "fused" in stem]
        fused.sort(key=lambda n: (n.count("+"), n))  # the lowest seed of a seed group comes first
        return fused[0] if fused else next(iter(names.values()))

    def fusion_selection(self) -> dict:
        """The retrieval stage's `runs/fusion_selection.json` ({} where there is none)."""
        f = self.runs / "fusion_selection.json"
        return json.loads(f.read_text(encoding="utf-8")) if f.exists() else {}

    def findings(self) -> list[str]:
        """The card beside the paper, the calibration table and the headline findings, computed by `eval.findings`
        from card.json and report.json (never typed in)."""
        from eval import findings as F

        report, card = self.args.out / "report" / "report.json", self.args.out / "card" / "card.json"
        lines = []
        card_json = F.load(card) if card.exists() else None
        if card_json is not None:
            lines += ["## The benchmark beside PSR (`python -m eval card`)", "", F.card_beside_paper(card_json)]
        if report.exists():
            rep = F.load(report)
            comp = self.runs / "complementarity.json"
            geometry = F.load(comp).get("geometry") if comp.exists() else None
            lines += ["## Calibration of the synthetic benchmark (`python -m eval findings --calibration "
                      "--complementarity runs/complementarity.json`)", "",
                      F.calibration_markdown(F.calibration(rep, card_json, geometry))]
            pred_json = self.args.out / "predictability" / "predictability.json"
            pred = F.load(pred_json) if pred_json.exists() else None
            ceiling = F.ceiling_markdown(rep, pred, card_json)
            if ceiling:
                lines += ["## Ceiling decomposition (`python -m eval findings --calibration --card card/card.json "
                          "--predictability predictability/predictability.json`)", "",
                          "What the labels allow (the state-tie ceiling of the card: every segment of the target's "
                          "canonical state tied first, which the semantic-text oracle scores exactly where every "
                          "positive carries that state; and the semantic-text oracle); what foresight allows (`python -m eval "
                          "predictability`: the query's true answer named by its usual label, then the answer of the "
                          "same video re-simulated with a perturbation far below a pixel just after the prefix, so "
                          "the share of the oracle that the world itself decides); what forecasting learns (LFTR "
                          "reading the simulator's exact state at the prefix's end: perfect perception; beside it a "
                          "state classifier, an MLP from the same exact state to the future state, which asks "
                          "whether another learner forecasts better from it); the present "
                          "as a label (the transition table, and the current state's segments tied first: "
                          "persistence with perfect perception); and what perception plus forecasting reach from "
                          "frames: through the paper's learned visual spaces, and through a perceiver supervised on "
                          "the simulator's labels of another world (`retrieval.perceiver`, not the paper's method), "
                          "alone and z-score fused with a visual target space chosen on validation as the paper "
                          "fuses its heads. R@5, seeds' means. How the perfect-perception rows grow with the training "
                          "data: `docs/ceiling-curve.md` (`python scripts/ceiling_curve.py`); the predictability "
                          "measurement by question and scene family: `docs/predictability.md`, and "
                          "`predictability/predictability.md` in the demo's output folder.", "",
                          ceiling]
            sel = [x for x in (self.selection_line(), self.perceiver_selection_line()) if x]
            lines += ["## Findings (computed from `report/report.json`)", "", *sel, *F.findings(rep, card_json), ""]
        return lines

    def seed_mean_pairs(self, sel: dict, singles: dict) -> list[str]:
        """``--pair`` arguments for the fusions' calibration check (`eval.findings`): the fusion through the perceiver
        against the perceiver's semantic head (their first seed's runs), and, with several seeds, each fusion (the
        headline and the perceiver's) against the single heads it must beat, on the seed means (`eval.report`'s
        ``--pair GROUP:GROUP``)."""
        chosen = self.perceiver_selection().get("chosen")
        own = f"lftr-{PERCEIVER}[{SEMANTIC}]"
        fusions = ([f"lftr-fusion[{'+'.join(sel['headline'])}]"] if sel.get("headline") else []) + (
            [f"lftr-{PERCEIVER}-fusion[{SEMANTIC}+{chosen}]"] if chosen else [])
        against = list(dict.fromkeys([own, *([f"lftr[{max(singles, key=singles.get)}]"] if singles else [])]))
        s = "-seed0" if self.args.seeds > 1 else ""  # with several seeds, a run test reads the first seed's runs
        out = ["--pair", f"{fusions[-1]}{s}:{own}{s}"] if chosen else []
        if self.args.seeds > 1:
            out += [x for f in fusions for a in against for x in ("--pair", f"{f}:{a}")]
        return out

    def perceiver_selection(self) -> dict:
        """The retrieval stage's choice of the perceiver fusion's visual space (`runs/fusion_selection_perceiver.json`;
        {} where there is none)."""
        f = self.runs / f"fusion_selection_{PERCEIVER}.json"
        return json.loads(f.read_text(encoding="utf-8")) if f.exists() else {}

    def perceiver_selection_line(self) -> str | None:
        """How the retrieval stage chose the visual space of the fusion through the perceiver on validation
        (`runs/fusion_selection_perceiver.json`), as a finding."""
        sel = self.perceiver_selection()
        scores, singles = sel.get("val_R@5"), sel.get("singles_val_R@5") or {}
        if not scores or sel.get("chosen") not in scores:
            return None
        return (f"- The fusion through the perceiver was chosen on the validation split (`runs/fusion_selection_"
                f"{PERCEIVER}.json`, the first seed's heads `lftr-{PERCEIVER}[...]`): `{SEMANTIC}+{sel['chosen']}` "
                "(validation R@5 of each visual space's pair: " + ", ".join(f"{n} {100 * v:.2f}"
                                                                          for n, v in scores.items())
                + "; of the single heads: " + ", ".join(f"{n} {100 * v:.2f}" for n, v in singles.items()) + ").")

    def selection_line(self) -> str | None:
        """How the retrieval stage chose its fusions on validation (`runs/fusion_selection.json`), as a finding."""
        sel = self.fusion_selection()
        fusions, pairs = sel.get("fusions_val_R@5"), sel.get("val_R@5")
        pair = next((f for f in fusions or {} if f.endswith("+" + str(sel.get("chosen")))), None)
        if not pairs or not sel.get("headline") or pair is None or "+".join(sel["headline"]) not in fusions:
            return None  # no record, or one this demo did not write: nothing to say
        head = "+".join(sel["headline"])
        others = ", ".join(f"`{f}` {100 * v:.2f}" for f, v in fusions.items() if f != head)
        return (f"- The fusions were chosen on the validation split, never on test (`runs/fusion_selection.json`, the "
                f"seed-{sel.get('seed', 0)} heads): the pair `{pair}` (validation R@5 of each visual space's pair: "
                + ", ".join(f"{n} {100 * v:.2f}" for n, v in pairs.items()) + f"); the headline, the reference of "
                f"the significance tests, `{head}` (validation R@5 {100 * fusions[head]:.2f}"
                + (f", against {others}" if others else "") + ").")

    def index(self) -> None:
        out = self.args.out
        lines = ["# PSR toolkit demo (synthetic benchmark)", "",
                 f"Benchmark: `{self.args.data}` (preset {self.args.preset}, seed {self.args.seed}; card in "
                 "[card/card.md](card/card.md)). "
                 "Every command below was run by `make demo`; rerun any of them on your own benchmark directory.", "",
                 "| output | what |", "|---|---|",
                 "| [report/main.md](report/main.md) | baselines, oracles, LFTR (semantic, visual, their fusion) and the "
                 "forecaster plumbing check, scored by one evaluator; more tables and plots in `report/` |",
                 *(["| `encoders/` | the SSL and LiT towers and the supervised perceiver (frozen encoders of the spaces "
                    "`ssl`, `lit` and `perceiver`), trained on the towers' own world |",
                    "| [runs/complementarity.md](runs/complementarity.md) | per-query wins of each space, their union, "
                    "the correlation of per-pair state similarity, each space's geometry (effective dimension, "
                    "anisotropy) |",
                    "| [runs/perception.md](runs/perception.md) | how much of the queried object's present state a "
                    "linear probe reads from each prefix space, beside the object's box alone |"]
                   if self.learned else []),
                 f"| `runs/` | one run file per method (the row *{PLUMBING_METHOD}* is a plumbing check of the forecaster "
                 "path with a tiny model, not a baseline) |",
                 "| [predictability/predictability.md](predictability/predictability.md) | the predictability "
                 "ceiling: answers kept when each test video is re-simulated with a sub-pixel perturbation after its "
                 "prefix, and the R@5 that foreseeing them reaches |",
                 "| `logs/` | the console output of the commands that ran beside others (`towers.log`: the towers' "
                 "pretraining beside the benchmark's build; `predictability.log`; `distill.log`: the distillation "
                 "recipe beside the canonicalization probes) |",
                 "| `canon/` | canonicalization probes: sweep, re-keyed benchmark, paraphrase oracle, description probe, "
                 "robust reads |",
                 "| `distill/` | distillation on CPU: the perception-solved student (evidence as text), three students "
                 "at equal budget, faithfulness, the validator's catch rates ([distill/results.md](distill/results.md)) |",
                 "",
                 *self.findings(), "## Commands", "",
                 "Wall seconds, and CPU seconds (user + system time of the command and of the processes it waited "
                 "for, every thread counted; on two cores a command that keeps both busy has twice its wall "
                 "seconds; started: seconds from the start of the demo call that ran it).", "",
                 "| stage | started | seconds | CPU s | command |", "|---|---:|---:|---:|---|"]
        log = self.merged_log(out / "demo_log.json")
        lines += [f"| {x['stage']} | {x.get('started_s', '')} | {x['seconds']} | {x.get('cpu_seconds', '')} "
                  f"| `{x['cmd']}` |" for x in log]
        from eval.threads import affinity_cpus

        cost = cost_summary(log, affinity_cpus())
        lines += ["", "## Cost", "", *cost] if cost else []
        self.cost = cost
        (out / "README.md").write_text("\n".join(lines) + "\n")
        (out / "demo_log.json").write_text(json.dumps(log, indent=2) + "\n")
        if self.args.results:
            self.results_page(self.args.results)

    def merged_log(self, path: Path) -> list[dict]:
        """The commands of this invocation, after those an earlier one logged in ``path`` for the stages not rerun
        now (a rerun of one stage keeps the others' commands and seconds)."""
        rerun = {x["stage"] for x in self.log}
        old = json.loads(path.read_text()) if path.exists() else []
        log = [x for x in old if x.get("stage") not in rerun] + self.log
        return sorted(log, key=lambda x: STAGES.index(x["stage"]) if x.get("stage") in STAGES else len(STAGES))

    def tower_costs(self) -> list[str]:
        """The learned encoders' (and the perceiver's) training cost from their records: epochs, items (frames, pairs,
        labelled windows), parameters, s/epoch (wall and CPU), peak RSS and the load average the epochs ran under (the
        machine is shared; CPU seconds are less inflated)."""
        rows = []
        for space in ("ssl", "lit", PERCEIVER):
            p = self.args.out / "encoders" / space / "psr_tower.json"
            if not p.exists():
                continue
            rec = json.loads(p.read_text())
            h = rec["history"]
            n = rec.get("frames") or rec.get("pairs") or rec.get("windows") or 0  # ssl, lit, perceiver
            wall, cpu = (sum(e[k] for e in h) / len(h) for k in ("seconds", "cpu_seconds"))
            loads = [e.get("load_avg", float("nan")) for e in h]
            prec = "/".join(sorted({e.get("precision", "fp32") for e in h}))  # records before the key: float32
            rows.append(f"| {space} ({rec['trainer']}) | {len(h)} | {n:,} | {rec['parameters']:,} | {prec} | "
                        f"{wall:.1f} | {cpu:.1f} | {sum(e['seconds'] for e in h) / 60:.1f} | "
                        f"{rec['peak_rss_mb']:.0f} | {min(loads):.1f}–{max(loads):.1f} |")
        if not rows:
            return []
        return ["| tower | epochs | train items | parameters | precision | s/epoch (wall) | CPU s/epoch | total (min) | "
                "peak RSS (MB) | load avg |", "|---|---:|---:|---:|---|---:|---:|---:|---:|---|", *rows]

    @staticmethod
    def command_line() -> str:
        """This run's command as a user would type it (from the repository root)."""
        return shlex.join(["python", "scripts/demo.py", *sys.argv[1:]])

    def results_page(self, path: Path) -> None:
        """The repository's results page (docs/results.md): the card beside the paper, the calibration table, the
        main table and the findings of this run, generated -- never edited by hand."""
        main_md = self.args.out / "report" / "main.md"
        horizon_md = self.args.out / "report" / "by_horizon.md"
        if not main_md.exists():
            return
        lines = ["# Results on the synthetic benchmark", "",
                 f"Generated by `{self.command_line()}` (`make demo` runs `scripts/demo.py`) from its own outputs; do "
                 "not edit by hand: rerun the command to regenerate. Preset `" + self.args.preset
                 + f"`, seed {self.args.seed}, {self.args.seeds} LFTR seed(s) per space; each number's command is in "
                 "`reports/demo/README.md`." + lftr_precisions(self.runs), "", *self.findings(),
                 "## Main table (`python -m eval report`)", "", main_md.read_text(encoding="utf-8"), ""]
        if horizon_md.exists():
            lines += ["## By horizon", "", horizon_md.read_text(encoding="utf-8"), ""]
        pairs_md, comp_md = self.args.out / "report" / "pairs.md", self.runs / "complementarity.md"
        if pairs_md.exists():
            lines += ["## Paired tests (`eval report --pair`)", "", pairs_md.read_text(encoding="utf-8"), ""]
        if comp_md.exists():
            lines += ["## Complementarity of the spaces (`retrieval demo`, as `retrieval complementarity`)", "",
                      comp_md.read_text(encoding="utf-8"), ""]
        perception_md = self.runs / "perception.md"
        if perception_md.exists():
            lines += ["## Perception of the present (`retrieval demo`, as `retrieval perception`)", "",
                      perception_md.read_text(encoding="utf-8"), ""]
        if self.cost:
            lines += ["## Cost of the demo (its commands, `reports/demo/demo_log.json`)", "", *self.cost, ""]
        towers = self.tower_costs()
        if towers:
            lines += ["## Encoder training cost (the towers' and the perceiver's own records, "
                      "`encoders/*/psr_tower.json`)", "", *towers, ""]
        from distill.results import section as distill_section

        lines += distill_section(self.args.out / "distill")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"results page: {path}")


def lftr_precisions(runs: Path) -> str:
    """A sentence naming the precision each LFTR head of ``runs`` trained in (``precision`` of its config, resolved
    on the machine: `auto` is bf16 only where the CPU computes it natively, so another machine may train in float32
    and round differently); "" when no head recorded one."""
    heads: dict[str, list[str]] = {}
    for info in sorted(runs.glob("lftr-*/train_info.json")):
        heads.setdefault(json.loads(info.read_text()).get("precision", "fp32"), []).append(info.parent.name)
    if not heads:
        return ""
    said = "; ".join(f"{len(v)} in {p}" for p, v in sorted(heads.items()))
    return (f" LFTR heads trained in this precision (`precision` of `configs/lftr/synth.yaml`, resolved on this machine; "
            f"`runs/lftr-*/train_info.json`): {said}.")


def cost_summary(log: list[dict], cpus: int) -> list[str]:
    """Markdown: each stage's wall and CPU seconds (the sums of its commands'), the total, and the least wall time
    that this much CPU work takes on ``cpus`` CPUs (its bound, however the commands are scheduled)."""
    stages: dict[str, list[float]] = {}
    for x in log:
        s = stages.setdefault(x["stage"], [0.0, 0.0])
        s[0] += float(x.get("seconds") or 0.0)
        s[1] += float(x.get("cpu_seconds") or 0.0)
    total = sum(c for _, c in stages.values())
    if total <= 0:
        return []
    lines = ["| stage | wall s (its commands) | CPU s | share of the CPU s |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {w:,.0f} | {c:,.0f} | {100 * c / total:.0f}% |" for name, (w, c) in stages.items()]
    lines += ["", f"{total:,.0f} CPU s in all: on {cpus} CPUs this work takes at least {total / cpus / 60:.1f} min "
                  "of wall time however its commands are scheduled (stages in two lanes overlap, so their wall seconds "
                  "add up to more than the demo's)."]
    return lines


def run_stages(demo: Demo, stages: list[str]) -> None:
    """Run ``stages`` in `STAGES` order, two lanes at once where one lane leaves a core mostly idle (each command's
    CPU seconds are in `demo_log.json`): the towers' pretraining, which reads nothing of the benchmark, beside the
    benchmark's build (`data`) and the canonicalization probes' fine-tune, which reads only the build; the world's
    predictability ceiling beside the forecaster check's runs and the report, which run on about one core (the
    check's tiny model is fitted first, alone: its fit uses both); the distillation recipe beside the
    canonicalization probes (a chain of short commands, each starting an interpreter, which leaves part of a core
    idle). A side lane's output goes to OUT/logs/<lane>.log."""
    todo = [s for s in STAGES if s in stages]
    logs = demo.args.out / "logs"
    for stage in STAGES:
        if stage not in todo:
            continue
        if stage == "data" and "encoders" in todo and demo.learned:
            # the build, then the canonicalization fine-tune (it reads only the build), beside the towers
            main_lane = (demo.data, demo.canon_finetune) if "canon" in todo else (demo.data,)
            demo.side_by_side(lambda lane=main_lane: [f() for f in lane], demo.towers, logs / "towers.log")
        elif stage == "forecaster" and "predictability" in todo:
            demo.forecaster_model()  # alone: its fit uses both cores
            main_lane = ["forecaster_runs"] + (["report"] if "report" in todo else [])
            demo.side_by_side(lambda lane=tuple(main_lane): [getattr(demo, s)() for s in lane], demo.predictability,
                              logs / "predictability.log")
            todo = [s for s in todo if s not in ("forecaster", "report", "predictability")]
        elif stage == "canon" and "distill" in todo:
            demo.side_by_side(demo.canon, demo.distill, logs / "distill.log")
            todo = [s for s in todo if s != "distill"]
        else:
            getattr(demo, stage)()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("data/psr-synth"), help="benchmark directory (built if missing)")
    ap.add_argument("--out", type=Path, default=Path("reports/demo"), help="where runs and reports go")
    ap.add_argument("--preset", default="demo", help="size of the synthetic benchmark: demo (default) or psr")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=3, help="LFTR seeds per space (reports show mean ± std; default 3)")
    ap.add_argument("--visual", choices=("ssl", "pixels"), default="ssl",
                    help="visual space: ssl (default: train the SSL and LiT towers, compare with pixels) or pixels "
                         "(the raw object crop only, no towers; faster)")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    ap.add_argument("--force", action="store_true", help="redo stages whose outputs exist")
    ap.add_argument("--results", default=str(ROOT / "docs" / "results.md"),
                    help="results page to regenerate (the repository's docs/results.md); '' to skip")
    args = ap.parse_args()
    args.data, args.out = args.data.resolve(), args.out.resolve()
    args.results = Path(args.results).resolve() if args.results else None
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        ap.error(f"unknown stage(s) {unknown}; choose from {STAGES}")
    if args.force and "retrieval" in stages and (args.out / "runs").exists():
        shutil.rmtree(args.out / "runs")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    demo = Demo(args)
    t0 = time.time()
    run_stages(demo, stages)
    demo.index()
    print(f"\ndemo done in {time.time() - t0:.0f} s: {args.out}/README.md")


if __name__ == "__main__":
    main()
