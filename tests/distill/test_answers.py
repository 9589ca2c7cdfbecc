"""The answers table: exact and snapped reads, a garbage line never parsed, every pair compared (CoT vs answer-only
included) with a bootstrap that resamples videos."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from distill.answers import AnswersConfig, compare_answers, video_bootstrap


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _student_line(q, raw):
    """A phrase-file line as the runner writes it for the student (parsed with `parse_answer_line`)."""
    from forecasters.parsing import parse_answer_line

    p = parse_answer_line(raw)
    return {"query_id": q.id, "phrase": p.phrase, "raw": raw, "parse_ok": p.ok, "flags": p.flags,
            "forecaster": "student"}


@pytest.fixture(scope="module")
def methods(synth_bench, tmp_path_factory):
    """Phrase files over the test split: ``wrong`` (always another state), ``oracle`` (a synonym of the truth, on
    an Answer: line), ``half`` (oracle on odd queries), ``garbage`` (a short junk line, no Answer: line)."""
    d = tmp_path_factory.mktemp("answers")
    qs = synth_bench.queries("test")
    members = {s.text: s.members for s in synth_bench.states()}
    other = {q.id: next(s for s in members if s != q.target_state) for q in qs}
    rows = {
        "wrong": [_student_line(q, f"Because.\nAnswer: {other[q.id]}") for q in qs],
        "oracle": [_student_line(q, f"It moves.\nAnswer: {members[q.target_state][-1]}") for q in qs],
        "garbage": [_student_line(q, "qwz blorp fnord") for q in qs],
    }
    rows["half"] = [o if i % 2 else w for i, (o, w) in enumerate(zip(rows["oracle"], rows["wrong"], strict=True))]
    return qs, {name: _write(d / f"{name}.jsonl", r) for name, r in rows.items()}


def test_exact_reads_and_every_pair(methods, synth_dir, tmp_path):
    qs, files = methods
    names = ["wrong", "half", "oracle"]
    res = compare_answers(AnswersConfig(data=str(synth_dir), phrases=[files[n] for n in names], names=names,
                                        out=str(tmp_path), resamples=2000))
    m = res["methods"]
    assert res["n_common"] == len(qs) and res["n_videos"] == len({q.video_id for q in qs})
    assert m["oracle"]["exact"]["accuracy"] == 1.0 and m["wrong"]["exact"]["accuracy"] == 0.0
    assert np.isclose(m["half"]["exact"]["accuracy"], (len(qs) // 2) / len(qs), atol=1 / len(qs))
    pairs = [(c["a"], c["b"], c["read"]) for c in res["comparisons"]]
    assert pairs == [("half", "wrong", "exact"), ("oracle", "wrong", "exact"), ("oracle", "half", "exact")]
    best = res["comparisons"][1]
    assert best["bootstrap_by_video"]["delta"] == 1.0 and best["mcnemar"]["b"] == len(qs)
    md = (tmp_path / "answers.md").read_text()
    assert "| oracle vs half | exact |" in md and "bootstrap by video" in md


def test_garbage_line_is_not_parsed(methods, synth_dir, tmp_path):
    _, files = methods
    res = compare_answers(AnswersConfig(data=str(synth_dir), phrases=[files["garbage"], files["oracle"]],
                                        names=["garbage", "oracle"], pairs=["oracle:garbage"], out=str(tmp_path),
                                        resamples=200))
    g = res["methods"]["garbage"]
    assert g["lenient_parse_rate"] == 1.0  # the student parser took the short junk line as a direct answer
    assert g["parse_rate"] == 0.0 and g["exact"]["accuracy"] == 0.0
    assert res["methods"]["oracle"]["parse_rate"] == 1.0


def test_direct_answer_counts_when_it_is_a_known_phrasing(synth_bench):
    from distill.answers import parsed, phrasing_lookup
    from eval.phrases import PhraseRecord

    lookup = phrasing_lookup(synth_bench)
    q = synth_bench.queries("test")[0]
    rec = PhraseRecord.from_dict(_student_line(q, q.target_state), path="-", line=1)
    assert "no_answer_line" in rec.flags and parsed(rec, lookup)
    junk = PhraseRecord.from_dict(_student_line(q, "zz top"), path="-", line=1)
    assert junk.ok and not parsed(junk, lookup)
    # open-vocabulary states can be longer than the student parser's direct-answer cap: a single line that is a
    # known phrasing still counts, a long junk line or a two-line output without an Answer: line does not
    from distill.answers import answer_phrase
    from forecasters.parsing import MAX_DIRECT_WORDS

    long = min((p for p in lookup if len(p.split()) > MAX_DIRECT_WORDS), key=lambda p: (len(p), p))
    rec = PhraseRecord.from_dict(_student_line(q, long), path="-", line=1)
    assert "no_answer_line" in rec.flags and answer_phrase(rec, lookup) == long
    for raw in (" ".join(["blorp"] * (MAX_DIRECT_WORDS + 2)), f"Thinking.\n{long}"):
        assert not parsed(PhraseRecord.from_dict(_student_line(q, raw), path="-", line=1), lookup), raw


def test_video_bootstrap_widens_with_correlated_queries():
    from eval.stats import paired_bootstrap

    rng = np.random.default_rng(0)
    videos = np.repeat(np.arange(40), 10)
    a = np.repeat(rng.integers(0, 2, 40), 10).astype(float)  # every query of a video moves together
    b = np.full(400, 0.5)
    clustered = video_bootstrap(a, b, videos, n_resamples=4000)
    naive = paired_bootstrap(a, b, n_resamples=4000)
    assert clustered.delta == naive.delta
    width = clustered.ci_high - clustered.ci_low
    assert width > 2.5 * (naive.ci_high - naive.ci_low)  # about sqrt(10) wider
    single = video_bootstrap(a[::10], b[::10], videos[::10], n_resamples=4000)
    assert single.ci_high - single.ci_low == pytest.approx(width, rel=0.15)  # one query per video: the same spread
    same = video_bootstrap(a, a, videos, n_resamples=500)
    assert same.delta == 0 and same.p_value == 1.0
    few = video_bootstrap(a[:100], b[:100], videos[:100], n_resamples=500)  # 10 videos: below the p-value floor
    assert few.p_value is None and few.ci_low <= few.delta <= few.ci_high


@pytest.fixture(scope="module")
def minilm_bench(synth_dir, tmp_path_factory):
    """A copy of the session's synthetic benchmark with a ``minilm`` semantic space (`retrieval encode`)."""
    from typer.testing import CliRunner

    from retrieval.cli import app

    d = tmp_path_factory.mktemp("minilm-bench") / "bench"
    d.mkdir()
    for f in ("manifest.json", "queries.jsonl", "corpus.jsonl", "states.jsonl"):
        shutil.copy2(synth_dir / f, d / f)
    os.symlink(synth_dir / "frames", d / "frames")
    r = CliRunner().invoke(app, ["encode", "--data", str(d), "--space", "minilm", "--model",
                                 "packaged:all-MiniLM-L6-v2", "--kind", "semantic"])
    assert r.exit_code == 0, r.output
    return d


@pytest.mark.slow
def test_snap_read_from_a_canonicalize_run(methods, minilm_bench, synth_bench, tmp_path):
    """The recipe's contract: ``retrieval search --canonicalize 1`` writes a run whose top segment's state is the
    snap read. A paraphrase that is no phrasing of any state misses the exact read and hits the snap read."""
    from typer.testing import CliRunner

    from eval.errors import InputError
    from retrieval.cli import app

    qs, files = methods
    # the target's own canonical text with an adverb: not a known phrasing, but the nearest state by far
    para = _write(tmp_path / "para.jsonl", [_student_line(q, f"Answer: {q.target_state} now") for q in qs])
    runs = {}
    for name, path in (("para", para), ("oracle", files["oracle"]), ("garbage", files["garbage"])):
        runs[name] = tmp_path / f"{name}+snap.parquet"
        r = CliRunner().invoke(app, ["search", "--data", str(minilm_bench), "--phrases", path, "--space", "minilm",
                                     "--split", "test", "--out", str(runs[name]), "--canonicalize", "1"])
        assert r.exit_code == 0, r.output
    names = ["garbage", "para", "oracle"]
    res = compare_answers(AnswersConfig(
        data=str(minilm_bench), phrases=[para if n == "para" else files[n] for n in names], names=names,
        snap_runs=[f"{n}={runs[n]}" for n in names], out=str(tmp_path / "o"), resamples=500))
    m = res["methods"]
    assert m["para"]["exact"]["accuracy"] == 0.0
    readable = 1 - res["snap_unreadable"] / len(qs)
    assert readable > 0.5
    assert m["para"]["snap"]["accuracy"] >= 0.9 * readable and m["oracle"]["snap"]["accuracy"] >= 0.9 * readable
    assert m["garbage"]["snap"]["accuracy"] == 0.0  # unparsed: its snap is ignored
    reads = {(c["a"], c["b"], c["read"]) for c in res["comparisons"]}
    assert ("para", "garbage", "snap") in reads and ("oracle", "para", "exact") in reads
    assert "snap %" in (tmp_path / "o" / "answers.md").read_text()
    plain = tmp_path / "plain.parquet"
    CliRunner().invoke(app, ["search", "--data", str(minilm_bench), "--phrases", para, "--space", "minilm",
                             "--split", "test", "--out", str(plain)])
    with pytest.raises(InputError, match="not a snap run"):
        compare_answers(AnswersConfig(data=str(minilm_bench), phrases=[para], names=["para"],
                                      snap_runs=[f"para={plain}"], out=str(tmp_path / "o2")))
