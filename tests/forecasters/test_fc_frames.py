"""``--frames all|last|K|spaced:K`` on every image forecaster: the request carries exactly the selected prefix frames
(in the backend's request and in the HTTP body), and the selection is in the config hash and the run config."""

from __future__ import annotations

import json

import pytest

from forecasters.backends import Backend, BackendConfig, Completion, ScoreResult
from forecasters.backends.openai_compat import OpenAIBackend, OpenAIConfig
from forecasters.likelihood import score_requests
from forecasters.media import FrameCache, FrameSelection
from forecasters.runner import RunConfig, plan
from forecasters.runner import run as run_job

SELECTIONS = [  # --frames value, the frames it keeps of the 8, identity key
    (None, lambda f: list(f), None),
    ("last", lambda f: [f[-1]], "last:1"),
    ("3", lambda f: list(f[-3:]), "last:3"),
    ("spaced:2", lambda f: [f[0], f[-1]], "spaced:2"),
]


class Recorder(Backend):
    """Records every request the runner sends (generation or scoring) and answers with a fixed phrase / scores."""

    name = "recorder"
    supports_scoring = True

    def __init__(self):
        super().__init__(BackendConfig(model="recorder", batch_size=4))
        self.sent: list = []

    def _generate_one(self, request):
        self.sent.append(request)
        return Completion(request.id, texts=["Answer: rolling down the ramp"], prompt_tokens=1, completion_tokens=1)

    def _score_one(self, request):
        self.sent.append(request.prompt)
        n = len(request.continuations)
        return ScoreResult(request.id, logprobs=[-1.0] * n, n_tokens=[1] * n, prompt_tokens=1)


def _sent_frames(request) -> list[str]:
    if request.videos:
        (video,) = request.videos
        return [f.source for f in video.frames]
    return [p.source for p in request.images]


@pytest.mark.parametrize("forecaster", ["m3", "llava", "llava-video", "student", "likelihood"])
def test_every_image_forecaster_sends_exactly_the_selected_frames(synth_dir, synth_bench, tmp_path, forecaster):
    hashes = set()
    for value, keep, key in SELECTIONS:
        out = tmp_path / f"{forecaster}-{value}.jsonl"
        backend = Recorder()
        s = run_job(RunConfig(data=str(synth_dir), out=str(out), forecaster=forecaster, model="recorder", limit=3,
                              frames=value, candidates="states", cpn_alpha=0, progress=False), backend=backend)
        assert s.complete and len(backend.sent) == 3
        for req in backend.sent:
            q = synth_bench.query(req.id)
            assert len(q.prefix_frames) == 8 and _sent_frames(req) == keep(q.prefix_frames), (forecaster, value)
            assert bool(req.videos) == (forecaster == "llava-video")
        conf = json.loads(out.with_name(out.stem + ".config.json").read_text())
        assert conf["identity"]["frames"] == key and conf["run"]["frames"] == (key or "all")
        hashes.add(s.config_hash)
    assert len(hashes) == len(SELECTIONS)  # each selection is its own config


def test_the_http_body_carries_exactly_the_selected_frames(synth_dir, synth_bench, tmp_path):
    http = OpenAIBackend(OpenAIConfig(model="m", base_url="http://127.0.0.1:9/v1"))
    for forecaster in ("m3", "likelihood"):
        for value, keep, _ in SELECTIONS:
            p = plan(RunConfig(data=str(synth_dir), out=str(tmp_path / "x.jsonl"), forecaster=forecaster,
                               backend="openai", model="m", limit=2, frames=value, candidates="states", cpn_alpha=0))
            frames = FrameCache(synth_bench.root, max_pixels=p.cfg.pixel_cap(p.spec))
            expected_cache = FrameCache(synth_bench.root, max_pixels=p.cfg.pixel_cap(p.spec))
            if forecaster == "likelihood":
                bodies = [http.score_payload(r.prompt, r.continuations[0]) for r in score_requests(p, frames)]
            else:
                bodies = [http.payload(p.request(q, frames)) for q in p.todo]
            for q, body in zip(p.todo, bodies, strict=True):
                user = body["messages"][0]["content"]
                urls = [c["image_url"]["url"] for c in user if c["type"] == "image_url"]
                assert urls == [expected_cache.get(f).data_url for f in keep(q.prefix_frames)]
                assert user[-1]["type"] == "text" and q.question in user[-1]["text"]


def test_frames_values_and_errors():
    paths = [f"f{i}.png" for i in range(8)]
    assert FrameSelection.parse("last").apply(paths) == ("f7.png",)
    assert FrameSelection.parse(4).apply(paths) == tuple(paths[4:])
    assert FrameSelection.parse("12").apply(paths) == tuple(paths)  # more than there are: all of them
    assert FrameSelection.parse("spaced:3").apply(paths) == ("f0.png", "f4.png", "f7.png")  # round(j * 7 / 2)
    assert FrameSelection.parse("all").key is None and str(FrameSelection.parse(None)) == "all"
    for bad in ("0", "-1", "first", "last:0", "all:2", "spaced", 1.5):
        with pytest.raises(ValueError, match="--frames"):
            FrameSelection.parse(bad)


def test_a_bad_frames_value_is_an_input_error(synth_dir, tmp_path):
    from eval.errors import InputError

    with pytest.raises(InputError, match="--frames"):
        plan(RunConfig(data=str(synth_dir), out=str(tmp_path / "x.jsonl"), forecaster="m3", frames="first"))
