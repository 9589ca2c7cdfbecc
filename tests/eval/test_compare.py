"""`python -m eval compare` (the paper's Table 3) on the session's synthetic benchmark: the numbers of table3.md and
compare.json against an independent computation from the run and phrase files, the steps it runs for missing
rows (they parse under the real retrieval / forecasters commands), and clear errors for bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from eval.cli import app
from eval.compare import CompareConfig, compare, plan_rows, slug
from eval.io import write_jsonl
from eval.runs import read_run, write_run
from eval.scoring import DenseSource, score_benchmark

PREDICTORS = {"M3": "m3.jsonl", "text-only": "text.jsonl"}
#: Rows of the table (text space minilm, CLIP space clip, visual space pixels) and the noise of their scores.
NOISE = {"M3->minilm": 0.9, "M3->clip t2i": 1.6, "M3 fused": 1.1, "text-only->minilm": 1.2,
         "text-only->clip t2i": 2.0, "text-only fused": 1.4, "LFTR->minilm": 1.0, "LFTR->pixels": 1.3,
         "LFTR fused": 0.8}
EXTERNAL = ("LFTR->minilm", "LFTR->pixels")  # passed as --lftr-run; the others are found in OUT/runs/


def _noisy_run(bench, rows: np.ndarray, label: str, noise: float, seed: int):
    """Scores = <onehot(target state) + noise, onehot(segment state) + noise>: no ties, quality set by ``noise``;
    k = the whole corpus, so the run file holds every rank."""
    rng = np.random.default_rng(seed)
    n_states = len(bench.state_ids)
    qs = bench.queries_ds.select(rows)
    q = np.eye(n_states, dtype=np.float32)[[bench.state_index[s] for s in qs["target_state_id"]]]
    items = np.eye(n_states, dtype=np.float32)[bench.segment_state_rows]
    src = DenseSource((q + noise * rng.normal(size=q.shape)).astype(np.float32),
                      (items + 0.5 * rng.normal(size=items.shape)).astype(np.float32))
    run = score_benchmark(bench, src, rows, method=slug(label), k=len(bench.corpus_ids), progress=False)
    run.name = slug(label)
    return run


@pytest.fixture(scope="module")
def table_inputs(synth_bench, tmp_path_factory):
    """Run files of every row (LFTR->pixels lacks the first 3 test queries) and two phrase files with failures."""
    bench, root = synth_bench, tmp_path_factory.mktemp("compare-inputs")
    rows = bench.query_rows("test")
    runs = {}
    for i, (label, noise) in enumerate(NOISE.items()):
        run = _noisy_run(bench, rows, label, noise, seed=i)
        runs[label] = run.select(run.query_ids[3:]) if label == "LFTR->pixels" else run
        write_run(root / "runs" / f"{slug(label)}.parquet", runs[label])
    ids = list(runs["M3->minilm"].query_ids)
    write_jsonl(root / "m3.jsonl", [{"query_id": q, "phrase": None if i % 7 == 0 else "falling",
                                     "error": "timeout" if i % 7 == 0 else None} for i, q in enumerate(ids)])
    write_jsonl(root / "text.jsonl", [{"query_id": q, "phrase": "x", "parse_ok": i % 5 != 1}
                                      for i, q in enumerate(ids) if i % 11 != 4])  # some queries have no line
    return root, runs


def _out_with_runs(inputs: Path, out: Path) -> Path:
    """An OUT folder from an earlier compare run whose rows are all built (so nothing needs to run)."""
    (out / "runs").mkdir(parents=True)
    for label in NOISE:
        if label not in EXTERNAL:
            (out / "runs" / f"{slug(label)}.parquet").write_bytes((inputs / "runs" / f"{slug(label)}.parquet").read_bytes())
    return out


def _args(data, inputs: Path, out: Path) -> list[str]:
    return ["compare", "--data", str(data), "--out", str(out), "--phrases", f"M3={inputs / 'm3.jsonl'}",
            "--phrases", f"text-only={inputs / 'text.jsonl'}", "--text-space", "minilm", "--clip-space", "clip",
            "--visual-space", "pixels", "--lftr-run", f"minilm={inputs / 'runs' / 'lftr-minilm.parquet'}",
            "--lftr-run", f"pixels={inputs / 'runs' / 'lftr-pixels.parquet'}", "--resamples", "200"]


def _independent(bench, run, order: list[str]) -> dict[str, float]:
    """R@1/5/10 and MRR over the fair Q1-Q4 queries of ``order`` straight from the run's full ranking: the rank of
    the first main-pool segment once the query's own video is removed."""
    video = dict(zip(bench.corpus_ids, bench.corpus_ds["video_id"], strict=True))
    pos = dict(zip(run.query_ids, range(run.n), strict=True))
    ranks = []
    for q in bench.queries("test"):
        if q.id not in order or not q.fair or q.qtype == "Q5":
            continue
        gt = set(q.gt())
        ranked = [c for c in run.topk_ids[pos[q.id]] if c and video[c] != q.video_id]  # "": padding
        ranks.append(next(i for i, c in enumerate(ranked, 1) if c in gt))
    r = np.array(ranks)
    return {"R@1": np.mean(r <= 1), "R@5": np.mean(r <= 5), "R@10": np.mean(r <= 10), "MRR": np.mean(1 / r),
            "n": len(r)}


@pytest.mark.slow
def test_compare_command_numbers_match_an_independent_computation(synth_dir, synth_bench, table_inputs, tmp_path):
    inputs, runs = table_inputs
    out = _out_with_runs(inputs, tmp_path / "table3")
    res = CliRunner().invoke(app, _args(synth_dir, inputs, out))
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "compare.json").read_text())

    ok_m3 = {json.loads(x)["query_id"] for x in (inputs / "m3.jsonl").read_text().splitlines()
             if json.loads(x)["error"] is None}
    ok_text = {json.loads(x)["query_id"] for x in (inputs / "text.jsonl").read_text().splitlines()
               if json.loads(x)["parse_ok"]}
    held = set.intersection(*(set(r.query_ids) for r in runs.values()))
    order = [q.id for q in synth_bench.queries("test") if q.id in held & ok_m3 & ok_text]
    assert doc["subset"] == {"n": len(order), "n_held_by_all": len(held), "query_ids": order}
    assert 0 < len(order) < len(held) - 10

    expect = {label: _independent(synth_bench, runs[label], order) for label in NOISE}
    for label, m in expect.items():
        got = doc["main"][label]
        assert got["n"] == m["n"]
        assert [got[k] for k in ("R@1", "R@5", "R@10", "MRR")] == pytest.approx([m[k] for k in ("R@1", "R@5", "R@10",
                                                                                                "MRR")], abs=1e-9)
        assert read_run(out / "subset" / f"{slug(label)}.parquet").query_ids == order
    text_rows = [lb for lb in NOISE if not lb.startswith("LFTR")]
    reference = max(text_rows, key=lambda lb: expect[lb]["R@5"])
    assert doc["reference"] == reference
    assert doc["runs"]["LFTR->pixels"] == str(inputs / "runs" / "lftr-pixels.parquet")

    lines = {ln.split(" | ")[0].lstrip("| "): ln for ln in (out / "table3.md").read_text().splitlines()
             if ln.startswith("| ") and not ln.startswith("| method")}
    assert list(lines) == list(NOISE)
    ref_r5 = expect[reference]["R@5"]
    for label, m in expect.items():
        cells = [c.strip() for c in lines[label].strip("|").split("|")]
        assert cells[1:5] == [f"{100 * m[k]:.1f}" for k in ("R@1", "R@5", "R@10", "MRR")]
        delta = "—" if label == reference else f"{100 * (m['R@5'] - ref_r5):+.2f}"
        assert cells[5] == delta
    report = json.loads((out / "report" / "report.json").read_text())
    assert report["config"]["reference"] == slug(reference) and report["config"]["intersect"] is True
    assert f"n = {expect[reference]['n']} of {len(held)} queries" in res.output


@pytest.mark.slow
def test_compare_builds_missing_rows_with_the_retrieval_commands(synth_dir, table_inputs, tmp_path):
    """Rows missing from OUT/runs are built in table order by steps that parse under the real commands; the
    step runner here stands in for the subprocess and writes the row's run file."""
    import click
    import typer

    from forecasters.cli import app as forecasters_app
    from retrieval.cli import app as retrieval_app

    inputs, runs = table_inputs
    cfg = CompareConfig(data=Path(synth_dir), out=tmp_path / "out", phrases={"M3": str(inputs / "m3.jsonl")},
                        text_spaces=("minilm",), clip_space="clip", visual_space="pixels", resamples=200,
                        lftr_config=(str(Path(__file__).parents[2] / "configs" / "lftr" / "synth.yaml"),),
                        lftr_set=("epochs=1",))
    by_path = {r.path: r.label for r in plan_rows(cfg)}
    steps = []

    def fake(args):
        steps.append(tuple(args))
        assert args[0] == "-m"
        cmd, rest = typer.main.get_command({"retrieval": retrieval_app, "forecasters": forecasters_app}[args[1]]), \
            list(args[2:])
        while isinstance(cmd, click.Group):  # down to the command itself, then parse its options (they must exist)
            cmd, rest = cmd.commands[rest[0]], rest[1:]
        cmd.make_context(cmd.name, rest)
        out = Path(args[args.index("--out") + 1])
        if out in by_path:
            write_run(out, runs[by_path[out]])

    result = compare(cfg, run=fake)
    kinds = [" ".join(s[2:4]) for s in steps]
    assert kinds == ["search --data", "search --data", "fuse --data", "lftr train", "lftr predict", "lftr train",
                     "lftr predict", "fuse --data"]
    assert steps[3][steps[3].index("--config") + 1].endswith("synth.yaml") and "epochs=1" in steps[3]
    assert list(result.main) == ["M3->minilm", "M3->clip t2i", "M3 fused", "LFTR->minilm", "LFTR->pixels",
                                 "LFTR fused"]
    steps.clear()
    compare(cfg, run=fake)  # a rerun finds every row and runs nothing
    assert steps == []


def test_compare_clear_errors(synth_dir, table_inputs, tmp_path):
    inputs, _ = table_inputs
    runner = CliRunner()
    out = tmp_path / "out"
    missing = _args(synth_dir, inputs, out)
    missing[missing.index(f"pixels={inputs / 'runs' / 'lftr-pixels.parquet'}")] = f"pixels={tmp_path / 'nope.parquet'}"
    res = runner.invoke(app, missing)
    assert res.exit_code == 2 and "--lftr-run pixels=" in res.output and "nope.parquet does not exist" in res.output
    assert not out.exists()  # nothing written

    res = runner.invoke(app, [*_args(synth_dir, inputs, out)[:-2], "--phrases", "m3"])
    assert res.exit_code == 2 and "NAME=VALUE" in res.output

    _out_with_runs(inputs, out)
    (out / "runs" / "m3-fused.parquet").write_text("not a run")
    res = runner.invoke(app, _args(synth_dir, inputs, out))
    assert res.exit_code == 2 and "m3-fused.parquet" in res.output and "Parquet" in res.output
    assert not (out / "table3.md").exists()

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    res = runner.invoke(app, _args(synth_dir, inputs, foreign))
    assert res.exit_code == 2 and "--overwrite" in res.output
    assert (foreign / "notes.txt").read_text() == "keep me"

    empty = inputs.parent / "empty.jsonl"
    write_jsonl(empty, [{"query_id": "nope", "phrase": "x"}])
    args = _args(synth_dir, inputs, _out_with_runs(inputs, tmp_path / "empty-subset"))
    args[args.index(f"text-only={inputs / 'text.jsonl'}")] = f"text-only={empty}"
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "intersection subset is empty" in res.output
