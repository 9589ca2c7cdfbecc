"""The whole non-LLM pipeline on a built benchmark, each stage timed and measured against its own bound.

    python scripts/psr_scale.py --data DIR --out DIR [--report DIR] [--lftr-epochs N] [--lftr-config FILE]

Stages (each one toolkit command, run as its own subprocess; the commands are in the JSON):

- ``encode-<sem>``: the semantic space with the packaged MiniLM (`python -m retrieval encode`); it writes into the
  benchmark's ``features/<sem>/`` (as `retrieval demo` does) and is skipped when that space exists;
- every baseline (random, question-only, lookup, knn-future, persistence, zero-shot) and oracle (semantic-text,
  state-prototype, independent-appearance; the paraphrase oracle when ``sim/phrases.jsonl`` exists), each in the
  space `retrieval demo` uses -> ``OUT/runs/<name>.parquet``;
- LFTR in both spaces: ``lftr-train-<space>`` (``--lftr-epochs``, default 1, over ``--lftr-config``, default the
  paper's full configuration) -> ``OUT/lftr-<space>/`` and ``lftr-predict-<space>`` on the test split;
- ``fusion``: z-score fusion of the two LFTR runs; ``report``: `python -m eval report` over every run with paired
  bootstrap significance against the fusion (``--resamples``) -> ``OUT/report/``.

``--without-lftr`` leaves out both LFTR spaces and the fusion (the report then has no reference run): the cost of
everything else, and a report whose calibration rows `python -m eval findings OUT/report --calibration` reads.

Measured per stage: wall seconds, CPU seconds and peak RSS of the stage's process tree (a small measuring parent
runs the command and reads ``resource.getrusage(RUSAGE_CHILDREN)``: ``ru_maxrss``, KB on Linux), the 1-minute load average before and after, and a **bound measured in the
same run, right after the stage, in this process with torch's default threads** (what the stage's child gets):

- scoring stages (baselines, oracles, LFTR predict): the float32 matmul ``(n_test x vectors per query, d) @
  (d, n_items)`` of the space scored (tiles of 1,024 x 65,536, the streaming scorer's shape, timed on one tile
  (best of 3) and scaled by the number of multiply-adds); fusion: the sum of its inputs' matmuls; random: the
  ``(n_test, 1) @ (1, n_corpus)`` matmul (one score per pair; it has no real matmul, so its ratio only says what
  writing a run costs and the scoring-ratio target leaves it out);
- ``encode``: a matmul with the multiply-adds of the encoder's linear layers over the tokens encoded
  (``n_tokens x params_linear``, tokens counted with the model's tokenizer);
- ``lftr-train``: forward + backward only (`retrieval.lftr.losses.LFTRLoss` and ``backward`` on ``--fb-batches`` pre-built batches
  of the training set, scaled to an epoch): ``ratio`` = s/epoch (train, no validation) / that, and
  ``outside_fb_share`` = 1 - fb / train seconds, the share of an epoch spent outside forward/backward
  (batch assembly, hard negatives, optimiser);
- ``report``: the bootstrap's matmul ``(resamples, n_test) @ (n_test, n_runs)``.

``ratio = stage seconds / bound seconds``. Each stage pays an interpreter start and imports: ``startup_s`` (one
``python -m retrieval --help``: the command line alone) and ``imports_s`` (one ``python -c "import eval.benchmark,
eval.scoring, retrieval.runs"``: what every scoring stage loads, torch, numba and datasets among it) are reported
once, not subtracted. The table (``scale.json``,
``scale.md`` in ``--report``, default ``OUT/scale``) names the stage that dominates, the total without LFTR
training, and the targets: pipeline <= 30 min without LFTR epochs; a stage scoring the whole corpus at most 1.5x
its bound; a stage scoring the semantic space's states (its bound is tiny: what it costs is fixed costs) at most
5 s over its bound; peak <= 8 GB.

The table is also recorded (`eval.measured`: docs/perf/psr_scale.json, which docs/performance.md shows;
``--record-dir`` / ``--no-record`` / ``--record-name``).

Resumable: a stage whose outputs exist is skipped (printed as such) and keeps its earlier measurement from
``scale.json``; nothing is ever deleted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file from a checkout: find the packages
PY = sys.executable
PACKAGED_MINILM = "packaged:all-MiniLM-L6-v2"
#: Tiles of the matmul bound: the streaming scorer's query block x corpus chunk.
TILE_M, TILE_N = 1024, 65536
TARGETS = {"pipeline_s_without_lftr_train": 30 * 60, "scoring_ratio": 1.5, "semantic_margin_s": 5.0,
           "peak_rss_mb": 8 * 1024}


@dataclass
class Stage:
    name: str
    cmd: list[str]
    outputs: list[Path]  # the stage is done when all exist
    bound: dict  # how its bound is measured (see the module docstring)
    group: str = "scoring"
    done: Callable[[], bool] | None = None  # optional extra test of completion

    def finished(self) -> bool:
        return all(p.exists() for p in self.outputs) and (self.done is None or self.done())


@dataclass
class Record:
    stage: str
    group: str
    cmd: str
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_rss_mb: float = 0.0
    load_before: float = 0.0
    load_after: float = 0.0
    bound_s: float = 0.0
    bound: str = ""
    ratio: float = 0.0
    extra: dict = field(default_factory=dict)
    #: a scoring stage in the semantic space: it scores the state vectors, so its bound is tiny and the target is
    #: on its fixed costs (``wall_s - bound_s``), not on its ratio
    state_space: bool = False


# --------------------------------------------------------------------------------------------------------------
# bounds
# --------------------------------------------------------------------------------------------------------------
def matmul_seconds(m: int, k: int, n: int, repeats: int = 3) -> float:
    """Seconds of a float32 ``(m, k) @ (k, n)`` matmul: one tile (at most `TILE_M` x `TILE_N`) timed best of
    ``repeats`` after a warm-up, scaled by ``m * n / tile``."""
    import torch

    tm, tn = max(1, min(m, TILE_M)), max(1, min(n, TILE_N))
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(tm, k, generator=g), torch.randn(tn, k, generator=g)
    a @ b.T
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b.T
        best = min(best, time.perf_counter() - t0)
    return best * (m * n) / (tm * tn)


def encode_bound(bench, model: str) -> tuple[float, str]:
    """Matmul with the multiply-adds of the text encoder's linear layers over the state texts' tokens."""
    import torch

    from retrieval.encoders import TextEncoder

    enc = TextEncoder(model)
    st = enc.model
    texts = list(bench.states_ds["text"][:])
    tok = st.tokenizer
    n_tokens = sum(len(ids) for ids in tok(texts, truncation=True, max_length=st.max_seq_length)["input_ids"])
    lin = sum(mod.weight.numel() for mod in st.modules() if isinstance(mod, torch.nn.Linear))
    d = enc.dim
    return matmul_seconds(n_tokens, d, max(1, lin // d)), f"matmul {n_tokens:,} tokens x {lin:,} linear params"


def fb_bound(bench, ckpt: Path, n_batches: int) -> tuple[float, dict]:
    """Forward + backward seconds of one epoch of LFTR at the benchmark's shape (``n_batches`` pre-built batches,
    scaled to the epoch's steps) for the checkpoint's config."""
    import torch

    from retrieval.lftr.batches import TrainBatches
    from retrieval.lftr.config import LFTRConfig
    from retrieval.lftr.data import mine_hard_negatives
    from retrieval.lftr.losses import LFTRLoss
    from retrieval.lftr.train import build_model, prepare, torch_threads

    cfg = LFTRConfig.from_yaml(ckpt / "config.yaml")
    with torch_threads(cfg.threads):
        prep = prepare(bench, cfg, ckpt, "cpu")
        rows = prep.data.rows(cfg.train_split)
        hard = None
        if cfg.n_hard_negatives:
            hard = mine_hard_negatives(prep.data, rows, cfg.n_hard_candidates, prep.cache,
                                       tag=f"{cfg.target_space}|{bench.root.resolve()}", progress=False)
        trainer = TrainBatches(cfg, prep.data, hard, rows, "cpu")
        model = build_model(cfg, prep.dims).train()
        loss_fn = LFTRLoss(model, trainer, cfg)
        gen = torch.Generator().manual_seed(cfg.seed)
        perm = rows[torch.randperm(len(rows), generator=gen).numpy()]
        steps = math.ceil(len(rows) / cfg.batch_size)
        batches = [trainer.batch(perm[s:s + cfg.batch_size], gen)
                   for s in range(0, min(len(perm), n_batches * cfg.batch_size), cfg.batch_size)]
        loss, _ = loss_fn(batches[0], gen)  # warm-up
        loss.backward()
        t0 = time.perf_counter()
        for b in batches:
            model.zero_grad(set_to_none=True)
            loss, _ = loss_fn(b, gen)
            loss.backward()
        per_step = (time.perf_counter() - t0) / len(batches)
    return per_step * steps, {"steps_per_epoch": steps, "fb_batches": len(batches), "fb_s_per_step": per_step,
                              "train_queries": int(len(rows)), "n_items": int(prep.data.items.shape[0]),
                              "batch_size": cfg.batch_size, "threads": cfg.threads, "d_model": cfg.d_model,
                              "n_samples": cfg.n_samples, "dims": list(prep.dims)}


# --------------------------------------------------------------------------------------------------------------
# the plan
# --------------------------------------------------------------------------------------------------------------
def plan(a: argparse.Namespace, bench) -> list[Stage]:
    """The stages in order (module docstring)."""
    data, runs, sem, vis = str(a.data), a.out / "runs", a.semantic_space, a.visual_space
    rb = [PY, "-m", "retrieval"]
    stages = [Stage(f"encode-{sem}", [*rb, "encode", "--data", data, "--space", sem, "--model", a.text_model,
                                      "--kind", "semantic"],
                    [a.data / "features" / sem / "meta.json"], {"kind": "encode"}, "encode")]

    def method(kind: str, name: str, space: str | None, stem: str | None = None) -> Stage:
        out = runs / f"{stem or name}.parquet"
        cmd = [*rb, kind, name, "--data", data, "--out", str(out), "--split", a.split]
        if space:
            cmd += ["--space", space, "--prefix-space", vis]
        bound = {"kind": "random"} if space is None else {"kind": "matmul", "space": space, "vectors": 1}
        return Stage(f"{kind}-{name}", cmd, [out], bound)

    stages += [method("baseline", "random", None), method("baseline", "question-only", sem),
               method("baseline", "lookup", sem), method("baseline", "knn-future", sem),
               method("baseline", "persistence", vis), method("baseline", "zero-shot", vis),
               method("oracle", "semantic-text", sem, "oracle-semantic-text"),
               method("oracle", "state-prototype", vis, "oracle-state-prototype"),
               method("oracle", "independent-appearance", vis, "oracle-independent-appearance")]
    if (a.data / "sim" / "phrases.jsonl").exists():
        stages.append(method("oracle", "paraphrase", sem, "oracle-paraphrase"))
    if not a.without_lftr:
        stages += _lftr_stages(a, rb, runs)
    run_files = [s.outputs[0] for s in stages if s.group == "scoring"]
    reference = [] if a.without_lftr else ["--reference", _fusion_name(a)]
    stages.append(Stage("report", [PY, "-m", "eval", "report", *map(str, run_files), "--data", data,
                                   "--out", str(a.out / "report"), *reference,
                                   "--resamples", str(a.resamples), "--split", a.split],
                        [a.out / "report" / "report.json"], {"kind": "report", "runs": len(run_files)}, "report"))
    return stages


def _fusion_name(a: argparse.Namespace) -> str:
    return f"lftr-fusion[{a.semantic_space}+{a.visual_space}]"


def _lftr_stages(a: argparse.Namespace, rb: list[str], runs: Path) -> list[Stage]:
    """LFTR training and prediction in both spaces, then their fusion."""
    data, sem, vis, stages = str(a.data), a.semantic_space, a.visual_space, []
    lftr_runs = []
    for space in (sem, vis):
        ck = a.out / f"lftr-{space}"
        cfgs = [x for c in a.lftr_config for x in ("--config", str(c))]
        train = [*rb, "lftr", "train", "--data", data, "--space", space, "--out", str(ck), "--prefix-space", vis,
                 "--question-space", sem, *cfgs, "--set", f"epochs={a.lftr_epochs}", "--seed", str(a.seed)]
        stages.append(Stage(f"lftr-train-{space}", train, [ck / "best.pt", ck / "history.jsonl"],
                            {"kind": "lftr-fb", "ckpt": str(ck)}, "lftr-train",
                            done=lambda ck=ck: _epochs_done(ck) >= a.lftr_epochs))
        run = runs / f"lftr-{space}.parquet"
        lftr_runs.append(run)
        stages.append(Stage(f"lftr-predict-{space}", [*rb, "lftr", "predict", "--data", data, "--ckpt", str(ck),
                                                      "--out", str(run), "--split", a.split,
                                                      "--method", f"lftr[{space}]"],
                            [run], {"kind": "matmul", "space": space, "ckpt": str(ck)}))
    fused = runs / f"lftr-fusion-{sem}+{vis}.parquet"
    stages.append(Stage("fusion", [*rb, "fuse", "--data", data, *[x for r in lftr_runs for x in ("--run", str(r))],
                                   "--out", str(fused), "--method", _fusion_name(a)],
                        [fused], {"kind": "fusion", "inputs": [f"lftr-predict-{sem}", f"lftr-predict-{vis}"]}))
    return stages


def _epochs_done(ck: Path) -> int:
    h = ck / "history.jsonl"
    return sum(1 for line in h.read_text(encoding="utf-8").splitlines() if line.strip()) if h.exists() else 0


def measure_bound(stage: Stage, bench, a: argparse.Namespace, done: dict[str, Record]) -> tuple[float, str, dict]:
    """``(seconds, description, extra)`` of the stage's bound (module docstring)."""
    b = stage.bound
    n_test = len(bench.query_rows(a.split))
    if b["kind"] == "encode":
        s, desc = encode_bound(bench, a.text_model)
        return s, desc, {}
    if b["kind"] == "random":
        return matmul_seconds(n_test, 1, len(bench.corpus_ids)), f"matmul ({n_test:,}, 1) @ (1, " \
                                                                  f"{len(bench.corpus_ids):,})", {}
    if b["kind"] == "matmul":
        from retrieval.spaces import Space

        sp = Space.load(bench, b["space"])
        vec = b.get("vectors") or _lftr_vectors(Path(b["ckpt"]))
        m = n_test * vec
        return matmul_seconds(m, sp.dim, sp.n_items), f"matmul ({m:,}, {sp.dim}) @ ({sp.dim}, {sp.n_items:,})", {}
    if b["kind"] == "fusion":
        recs = [done[n] for n in b["inputs"] if n in done]
        return sum(r.bound_s for r in recs), "sum of its inputs' matmuls", {}
    if b["kind"] == "report":
        return (matmul_seconds(a.resamples, n_test, b["runs"]),
                f"matmul ({a.resamples:,}, {n_test:,}) @ ({n_test:,}, {b['runs']})", {})
    if b["kind"] == "lftr-fb":
        s, extra = fb_bound(bench, Path(b["ckpt"]), a.fb_batches)
        return s, f"forward+backward only, {extra['fb_batches']} batches scaled to {extra['steps_per_epoch']} steps", extra
    raise ValueError(f"unknown bound {b}")


def _lftr_vectors(ck: Path) -> int:
    from retrieval.lftr.config import LFTRConfig

    cfg = LFTRConfig.from_yaml(ck / "config.yaml")
    return cfg.n_samples if cfg.use_sigma else 1


# --------------------------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------------------------
#: The measuring parent of a stage: a small fresh interpreter that runs the command and writes the command's own
#: wall seconds and ``getrusage(RUSAGE_CHILDREN)`` (CPU seconds, peak RSS in KB). A child forked straight from this
#: (large) process would inherit its RSS high-water mark through fork + exec; one forked from this small parent
#: starts from the parent's few MB.
MEASURE = ("import json, resource, subprocess, sys, time\n"
           "t = time.perf_counter(); rc = subprocess.call(sys.argv[2:]); wall = time.perf_counter() - t\n"
           "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
           "open(sys.argv[1], 'w').write(json.dumps({'rc': rc, 'wall_s': wall, 'cpu_s': ru.ru_utime + ru.ru_stime,"
           " 'maxrss_kb': ru.ru_maxrss}))\n")


def run_stage(stage: Stage, log_dir: Path) -> Record:
    """Run the stage's command under `MEASURE`: wall, CPU and peak RSS of its process tree."""
    print(f"\n[{stage.name}] $ {shlex.join(stage.cmd)}", flush=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    rec = Record(stage.name, stage.group, shlex.join(stage.cmd), load_before=os.getloadavg()[0])
    stats = log_dir / f"{stage.name}.rusage.json"
    with open(log_dir / f"{stage.name}.log", "w", encoding="utf-8") as logf:
        subprocess.run([PY, "-c", MEASURE, str(stats), *stage.cmd], cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT,
                       check=False)
    m = json.loads(stats.read_text(encoding="utf-8")) if stats.exists() else {"rc": "no measurement"}
    rec.load_after = os.getloadavg()[0]
    if m["rc"] != 0:
        tail = (log_dir / f"{stage.name}.log").read_text(encoding="utf-8", errors="replace")[-3000:]
        raise SystemExit(f"stage {stage.name} failed (exit {m['rc']}); its log {log_dir / stage.name}.log "
                         f"ends:\n{tail}\nrerun the same command to resume from this stage")
    rec.wall_s, rec.cpu_s, rec.peak_rss_mb = m["wall_s"], m["cpu_s"], m["maxrss_kb"] / 1024
    return rec


def startup_seconds(argv: list[str]) -> float:
    """Wall seconds of ``python ARGV`` (output discarded)."""
    t0 = time.perf_counter()
    subprocess.run([PY, *argv], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def summarise(recs: list[Record], meta: dict) -> dict:
    total = sum(r.wall_s for r in recs)
    without_train = sum(r.wall_s for r in recs if r.group != "lftr-train")
    dom = max(recs, key=lambda r: r.wall_s)
    # random: no matmul; the semantic space's stages: their own target (the margin over the bound)
    scoring = [r for r in recs if r.group == "scoring" and r.stage != "baseline-random" and not r.state_space]
    worst = max(scoring, key=lambda r: r.ratio) if scoring else None
    semantic = [r for r in recs if r.group == "scoring" and r.state_space]
    widest = max(semantic, key=lambda r: r.wall_s - r.bound_s) if semantic else None
    peak = max(r.peak_rss_mb for r in recs)
    return {**meta, "stages": [asdict(r) for r in recs], "total_s": total, "total_s_without_lftr_train": without_train,
            "dominant": {"stage": dom.stage, "wall_s": dom.wall_s, "share": dom.wall_s / total if total else 0.0},
            "peak_rss_mb": peak, "worst_scoring_ratio": None if worst is None else
            {"stage": worst.stage, "ratio": worst.ratio},
            "worst_semantic_margin": None if widest is None else
            {"stage": widest.stage, "margin_s": widest.wall_s - widest.bound_s},
            "targets": TARGETS, "meets": {
                # without LFTR the total leaves out LFTR prediction and the fusion, which the target counts
                "pipeline_s_without_lftr_train": None if meta.get("without_lftr") else
                without_train <= TARGETS["pipeline_s_without_lftr_train"],
                "scoring_ratio": worst is None or worst.ratio <= TARGETS["scoring_ratio"],
                "semantic_margin_s": widest is None or
                widest.wall_s - widest.bound_s <= TARGETS["semantic_margin_s"],
                "peak_rss_mb": peak <= TARGETS["peak_rss_mb"]}}


def markdown(doc: dict) -> str:
    lines = [f"Benchmark `{doc['data']}` ({doc['n_queries']:,} queries, {doc['n_test']:,} test, {doc['n_corpus']:,} "
             f"segments, {doc['n_states']:,} states); {doc['cpus']} CPUs; per stage, the command line starts in "
             f"{doc['startup_s']:.1f} s and a scoring stage's imports take {doc['imports_s']:.1f} s (not subtracted). "
             f"Command: `{doc['command']}`.", "",
             "| stage | wall s | CPU s | peak RSS MB | load before/after | bound s | ratio | bound |",
             "|---|---:|---:|---:|---|---:|---:|---|"]
    for r in doc["stages"]:
        lines.append(f"| {r['stage']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['peak_rss_mb']:.0f} | "
                     f"{r['load_before']:.1f} / {r['load_after']:.1f} | {r['bound_s']:.3g} | {r['ratio']:.3g} | "
                     f"{r['bound']} |")
    total = (f"Total {doc['total_s']:.0f} s with LFTR (training and prediction) and the fusion left out "
             f"(`--without-lftr`; the target, <= {TARGETS['pipeline_s_without_lftr_train']} s without LFTR training, "
             "also counts LFTR prediction and the fusion)" if doc.get("without_lftr") else
             f"Total {doc['total_s']:.0f} s; without LFTR training {doc['total_s_without_lftr_train']:.0f} s "
             f"(target <= {TARGETS['pipeline_s_without_lftr_train']} s)")
    lines += ["", f"{total}; peak RSS {doc['peak_rss_mb']:.0f} MB "
              f"(target <= {TARGETS['peak_rss_mb']} MB); worst ratio of a stage scoring the whole corpus "
              + (f"{doc['worst_scoring_ratio']['ratio']:.2f} ({doc['worst_scoring_ratio']['stage']}; target <= "
                 f"{TARGETS['scoring_ratio']})" if doc["worst_scoring_ratio"] else "n/a")
              + "; widest margin of a stage scoring the semantic space's states over its bound "
              + (f"{doc['worst_semantic_margin']['margin_s']:.1f} s ({doc['worst_semantic_margin']['stage']}; "
                 f"target <= {TARGETS['semantic_margin_s']:.0f} s)" if doc.get("worst_semantic_margin") else "n/a")
              + ".",
              f"Dominant stage: **{doc['dominant']['stage']}** ({doc['dominant']['wall_s']:.0f} s, "
              f"{doc['dominant']['share'] * 100:.0f}% of the total)."]
    for r in doc["stages"]:
        if r["group"] == "lftr-train" and r["extra"]:
            e = r["extra"]
            lines.append(f"LFTR {r['stage']}: {e['s_per_epoch']:.1f} s/epoch (train, no validation; "
                         f"{e['steps_per_epoch']} steps of {e['batch_size']}), forward+backward "
                         f"{e['fb_s_per_epoch']:.1f} s/epoch, {e['outside_fb_share'] * 100:.0f}% outside "
                         "forward/backward.")
    return "\n".join(lines) + "\n"


def lftr_train_record(rec: Record, ck: Path, fb_s: float, extra: dict) -> None:
    """s/epoch from the trainer's own history (train seconds, validation excluded) against forward+backward."""
    hist = [json.loads(x) for x in (ck / "history.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    s_epoch = sum(h["train_seconds"] for h in hist) / len(hist)
    rec.extra = {**extra, "s_per_epoch": s_epoch, "fb_s_per_epoch": fb_s, "epochs": len(hist),
                 "val_s_per_epoch": sum(h.get("val_seconds", 0.0) for h in hist) / len(hist),
                 "outside_fb_share": max(0.0, 1.0 - fb_s / s_epoch) if s_epoch else 0.0}
    rec.bound_s, rec.ratio = fb_s, s_epoch / fb_s if fb_s else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a built benchmark with a visual space holding prefixes")
    ap.add_argument("--out", type=Path, required=True, help="runs, LFTR checkpoints, report, logs")
    ap.add_argument("--report", type=Path, default=None, help="folder of scale.json / scale.md (default OUT/scale)")
    ap.add_argument("--lftr-epochs", type=int, default=1, help="LFTR epochs per space (default 1)")
    ap.add_argument("--lftr-config", type=Path, action="append", default=[],
                    help="LFTR YAML config(s) (default: the paper's full configuration)")
    ap.add_argument("--semantic-space", default="minilm")
    ap.add_argument("--visual-space", default="pixels")
    ap.add_argument("--text-model", default=PACKAGED_MINILM, help="encoder of the semantic space")
    ap.add_argument("--split", default="test")
    ap.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples of the report")
    ap.add_argument("--fb-batches", type=int, default=8, help="batches of the forward+backward bound")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--without-lftr", action="store_true",
                    help="leave out LFTR (training and prediction) and the fusion: encoding, the baselines, the "
                         "oracles and the report")
    from eval.measured import add_record_options, load_now, record_from_args

    add_record_options(ap, "psr_scale")
    a = ap.parse_args(argv)
    load_before = load_now()
    a.data, a.out = a.data.resolve(), a.out.resolve()
    report = (a.report or a.out / "scale").resolve()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from eval.benchmark import Benchmark
    from eval.io import write_json

    bench = Benchmark.load(a.data)
    if not (a.data / "features" / a.visual_space / "prefixes.npy").exists():
        raise SystemExit(f"{a.data}: the visual space {a.visual_space!r} has no prefixes table; encode it first")
    a.out.mkdir(parents=True, exist_ok=True)
    old = {}
    if (report / "scale.json").exists():
        old = {r["stage"]: Record(**r) for r in json.loads((report / "scale.json").read_text())["stages"]}
    recs: dict[str, Record] = {}
    meta = {"data": str(a.data), "command": shlex.join([Path(PY).name, "scripts/psr_scale.py", *(argv or
                                                        sys.argv[1:])]),
            "n_queries": len(bench.query_ids), "n_test": len(bench.query_rows(a.split)),
            "n_corpus": len(bench.corpus_ids), "n_states": len(bench.states_ds), "cpus": os.cpu_count(),
            "startup_s": startup_seconds(["-m", "retrieval", "--help"]),
            "imports_s": startup_seconds(["-c", "import eval.benchmark, eval.scoring, retrieval.runs"]),
            "lftr_epochs": 0 if a.without_lftr else a.lftr_epochs, "without_lftr": a.without_lftr,
            "lftr_config": [str(c) for c in a.lftr_config] or "paper defaults"}

    def save() -> dict:
        """The table so far (after every stage, so a stopped run keeps what it measured)."""
        doc = summarise(list(recs.values()), meta)
        write_json(report / "scale.json", doc)
        (report / "scale.md").write_text(markdown(doc), encoding="utf-8")
        return doc

    report.mkdir(parents=True, exist_ok=True)
    for stage in plan(a, bench):
        if stage.finished():
            print(f"[{stage.name}] skipped: its outputs exist ({', '.join(map(str, stage.outputs))})", flush=True)
            if stage.name in old:
                recs[stage.name] = old[stage.name]
            else:
                print(f"[{stage.name}] no earlier measurement in {report / 'scale.json'}: not in the table")
            continue
        rec = run_stage(stage, a.out / "logs")
        bound_s, rec.bound, extra = measure_bound(stage, bench, a, recs)
        if stage.group == "lftr-train":
            lftr_train_record(rec, Path(stage.bound["ckpt"]), bound_s, extra)
        else:
            rec.bound_s, rec.extra = bound_s, extra
            rec.ratio = rec.wall_s / bound_s if bound_s > 0 else 0.0
            rec.state_space = stage.bound.get("space") == a.semantic_space
        recs[stage.name] = rec
        print(f"[{stage.name}] {rec.wall_s:.1f} s wall, peak {rec.peak_rss_mb:.0f} MB, bound {rec.bound_s:.3g} s "
              f"-> ratio {rec.ratio:.3g}", flush=True)
        save()
    doc = save()
    print("\n" + markdown(doc))
    record_from_args(a, "psr_scale", title="The whole pipeline at PSR scale, stage by stage", markdown=markdown(doc),
                     data=doc, load=(load_before, load_now()),
                     argv=["scripts/psr_scale.py", *(sys.argv[1:] if argv is None else argv)])
    print(f"dominant stage: {doc['dominant']['stage']} ({doc['dominant']['share'] * 100:.0f}% of {doc['total_s']:.0f} s)"
          f"; table in {report / 'scale.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
