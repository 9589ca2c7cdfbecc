"""Nothing lost through a link (issue 22, item 1).

A canonicalized benchmark links ``frames/``, ``sim/`` and its visual spaces into the build it was made from, records
that build in its manifest (``dependencies``) and registers itself there (``.psr-dependents.json``). No command may
replace what a benchmark links to -- whether the benchmark is an input of the job or not, with or without
``--overwrite`` -- and every loader refuses a benchmark whose links are broken or whose source was rebuilt since.
"""

from __future__ import annotations

import json
import shutil

import pytest
from cli_run import assert_one_clear_error, run_cli, snapshot

MINILM = "packaged:all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def truth_template(tmp_path_factory):
    from eval.synth import build_benchmark

    return build_benchmark(tmp_path_factory.mktemp("links") / "t-truth", videos=6, seed=0, progress=False)


@pytest.fixture(scope="module")
def encoder():
    from retrieval.encoders import TextEncoder

    return TextEncoder(MINILM, device="cpu")


def _link(truth_template, encoder, root) -> dict:
    """A truth build ``root/b-truth`` copied from the template and the benchmark ``root/b`` canonicalized from it
    (linking into it), with a random run of it."""
    from retrieval.canon.apply import ApplyConfig, apply_canonicalization

    truth = root / "b-truth"
    shutil.copytree(truth_template, truth, ignore=shutil.ignore_patterns(".cache"))
    bench = root / "b"
    apply_canonicalization(ApplyConfig(data=str(truth), out=str(bench), threshold=0.85, model=MINILM),
                           progress=False, log=lambda *_: None, encoder=encoder)
    run = root / "random.parquet"
    res = run_cli("retrieval", "baseline", "random", "--data", bench, "--out", run, "--split", "train")
    assert res.code == 0, res.text
    return {"root": root, "truth": truth, "bench": bench, "run": run}


@pytest.fixture(scope="module")
def linked(truth_template, encoder, tmp_path_factory):
    """The linked pair shared by the tests that only read it or are refused writing into it (each checks that the
    truth build is unchanged)."""
    return _link(truth_template, encoder, tmp_path_factory.mktemp("linked"))


@pytest.fixture
def linked_private(truth_template, encoder, tmp_path):
    """A private linked pair, for a test that rewrites and moves its truth build."""
    return _link(truth_template, encoder, tmp_path)


def _truth_files(w) -> dict[str, str]:
    return snapshot(w["truth"], skip=(".cache",))


def test_the_benchmark_records_and_registers_what_it_links_into(linked):
    m = json.loads((linked["bench"] / "manifest.json").read_text())
    (dep,) = m["dependencies"]
    assert dep["path"] == str(linked["truth"].resolve())
    assert dep["links"] == ["features/pixels", "features/sim", "frames", "sim"]
    reg = json.loads((linked["truth"] / ".psr-dependents.json").read_text())
    assert reg["dependents"] == [str(linked["bench"].resolve())]


@pytest.mark.parametrize("extra", [[], ["--overwrite"]])
def test_synth_into_the_build_a_benchmark_links_to_is_refused(linked, extra):
    """The truth build is `eval synth`'s own earlier output, and the benchmark is no input of the job."""
    before = _truth_files(linked)
    res = run_cli("eval", "synth", "--out", linked["truth"], "--videos", "4", *extra)
    assert_one_clear_error(res, str(linked["truth"]), "depends on", str(linked["bench"].resolve()))
    assert _truth_files(linked) == before
    assert run_cli("eval", "validate", linked["bench"]).code == 0


def test_score_and_apply_into_what_an_input_links_to_are_refused(linked):
    w = linked
    before = _truth_files(w)
    for out in (w["truth"], w["truth"] / "frames", w["bench"] / "frames", w["truth"] / "features"):
        res = run_cli("eval", "score", "--data", w["bench"], "--run", w["run"], "--out", out, "--overwrite")
        assert_one_clear_error(res, str(out), "depends on", "not even with --overwrite")
        res = run_cli("retrieval", "canon", "apply", "--data", w["bench"], "--out", out, "--model", MINILM,
                      "--overwrite")
        assert_one_clear_error(res, str(out), "depends on")
    assert _truth_files(w) == before


def test_loaders_refuse_broken_links_and_a_rebuilt_source(linked_private):
    from eval.benchmark import Benchmark
    from eval.io import FormatError
    from eval.validate import validate

    w = linked_private
    Benchmark.load(w["bench"])
    # the source rebuilt in place (here: its manifest changed) -> the links now show other data
    m = json.loads((w["truth"] / "manifest.json").read_text())
    m["extra"]["seed"] = 99
    (w["truth"] / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FormatError, match="rebuilt since"):
        Benchmark.load(w["bench"])
    assert "stale_dependency" in validate(w["bench"]).kinds()
    res = run_cli("eval", "score", "--data", w["bench"], "--run", w["run"], "--out", w["root"] / "rep")
    assert_one_clear_error(res, "manifest.json", "dependencies[0]", "retrieval synth --out")
    # the source gone -> every link dangles
    w["truth"].rename(w["root"] / "elsewhere")
    with pytest.raises(FormatError, match="does not exist"):
        Benchmark.load(w["bench"])
    kinds = [p.kind for p in validate(w["bench"]).problems]
    assert kinds.count("broken_link") == 5  # four links (pixels and sim features, frames, sim) and the dependency


#: Videos of the canonicalization encoder's disjoint world in the rebuild test (the default is `ENCODER_VIDEOS`): the
#: fine-tune runs as in every build, on fewer triples (each seed fine-tunes its own encoder).
ENCODER_TEST_VIDEOS = 12


@pytest.mark.slow
def test_retrieval_synth_rebuilds_a_truth_its_own_benchmark_links_to(tmp_path, monkeypatch):
    """`retrieval synth` may replace the truth build its own `--out` links to: it rebuilds both."""
    import functools

    import retrieval.synth
    from eval.benchmark import Benchmark
    from retrieval.synth import build_synth

    monkeypatch.setattr(retrieval.synth, "canonicalization_encoder",
                        functools.partial(retrieval.synth.canonicalization_encoder, videos=ENCODER_TEST_VIDEOS))
    out = tmp_path / "psr"
    build_synth(out, videos=4, seed=0, progress=False, log=lambda *_: None)
    first = Benchmark.load(out).fingerprint
    build_synth(out, videos=4, seed=1, progress=False, log=lambda *_: None)
    b = Benchmark.load(out)  # links and dependency consistent again
    assert b.fingerprint != first and b.manifest.extra["seed"] == 1
    tuned = json.loads((tmp_path / "psr-encoder" / "finetune_config.json").read_text())["source"]
    assert tuned["seed"] == 1 + retrieval.synth.ENCODER_SEED_OFFSET  # the rebuild fine-tuned its own encoder
    assert b.manifest.extra["canonicalization"]["model"] == str((tmp_path / "psr-encoder" / "model").resolve())
