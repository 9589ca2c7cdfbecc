"""The architecture cases of `test_fc_architectures.py`, shared by the test (toolkit venv) and `arch_driver.py` (vLLM
venv): one tiny model per preset architecture, the requests each one answers, and how token ids are captured from the
``hf`` and ``vllm`` backends without changing them.

Greedy agreement between two engines on one request means: the same prompt token ids, and the same generated token
ids at every step up to ``MAX_TOKENS`` (both stop at the same step, on the same end-of-sequence token or at the cap).
Captured next to the ids: the log-probability each engine gave each chosen token (float32 on CPU in both engines),
so a disagreement can be told apart from a near tie.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
from PIL import Image

from forecasters.backends import ImagePart, Request, SamplingParams, VideoPart

#: Generated tokens compared per request.
MAX_TOKENS = 12
#: Frames per prompt (the paper's M3: 8 prefix frames), as images or as one video.
N_FRAMES = 8
QUESTIONS = ("What will the red ball do next?", "Where does the cup end up?")
#: A frame rate at which Qwen2.5-VL's temporal positions of an 8-frame test video (4 temporal patches, at
#: ``tokens_per_second * 2 / fps`` apart) stay below the positions of its merged 3 x 4 grid.
FAST_FPS = 20.0


@dataclass(frozen=True)
class ArchCase:
    """One preset architecture: the tiny ``kind`` (built with ``template="native"``), the presets / models it stands
    for, the forecasters run on it, the media its vLLM implementation takes, and whether a LoRA student is run."""

    kind: str
    stands_for: tuple[str, ...]
    forecasters: tuple[str, ...]
    media: tuple[str, ...]  # "images" and/or "video": what the architecture takes (in vLLM's implementation too)
    lora: bool = False
    served_name: str = "tiny"

    @property
    def server_args(self) -> tuple[str, ...]:
        limits = {"images": '"image": 8', "video": '"video": 1'}
        args = ["--limit-mm-per-prompt", "{" + ", ".join(limits[m] for m in self.media) + "}"] if self.media else []
        if "video" in self.media:  # a video's frame rate travels per request (media_io_kwargs)
            args.append("--trust-request-mm-kwargs")
        return tuple(args)


CASES = (
    ArchCase("qwen3_vl", ("m3", "student-8b", "student-2b"), ("m3", "student"), ("images", "video"), lora=True),
    ArchCase("qwen2_5_vl", ("text-only",), ("text-only", "m3"), ("images", "video")),
    ArchCase("llava_next", ("llava",), ("llava",), ("images",)),
    ArchCase("llava_next_video", ("llava-video-7b", "llava-video-34b"), ("llava-video",), ("video",)),
    ArchCase("qwen3", ("teacher",), ("text-only",), ()),
)
BY_KIND = {c.kind: c for c in CASES}


def frames(seed: int, n: int = N_FRAMES) -> tuple[ImagePart, ...]:
    """``n`` random 120 x 160 RGB frames (deterministic in ``seed``)."""
    rng = np.random.default_rng(seed)
    return tuple(ImagePart(Image.fromarray((rng.random((120, 160, 3)) * 255).astype("uint8")), source=f"f{seed}.{i}")
                 for i in range(n))


def requests(case: ArchCase) -> list[Request]:
    """The agreement requests of an architecture: 2 text prompts, then per medium it takes 2 prompts of 8 frames
    (as 8 images, or as one video: at 1 fps, then at 2 fps), and for video a third at `FAST_FPS`."""
    sp = SamplingParams(max_tokens=MAX_TOKENS)
    out = [Request(f"text{i}", (q,), sp) for i, q in enumerate(QUESTIONS)]
    for i, q in enumerate(QUESTIONS):
        if "images" in case.media:
            out.append(Request(f"images{i}", (*frames(10 + i), q), sp))
        if "video" in case.media:  # 1 and 2 frames per second: the rate must reach every engine
            out.append(Request(f"video{i}", (VideoPart(frames(20 + i), fps=1.0 + i), q), sp))
    if "video" in case.media:  # FAST_FPS: Qwen2.5-VL's time positions stay within the frame's (see the test)
        out.append(Request(f"video{len(QUESTIONS)}", (VideoPart(frames(30), fps=FAST_FPS), QUESTIONS[0]), sp))
    return out


@dataclass
class Trace:
    """What one engine did with one request: prompt and generated token ids, the log-probability of each generated
    token, the decoded text the backend returned (or its error)."""

    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def hf_traces(backend, reqs: list[Request]) -> dict[str, Trace]:
    """Run ``reqs`` one at a time through an ``hf`` backend, recording the ids its ``model.generate`` call saw and
    produced (and the logits, asked for on the side; greedy decoding is unchanged by them)."""
    import torch

    calls = []
    generate = backend.model.generate

    def recording_generate(**kw):
        out = generate(**kw, output_logits=True, return_dict_in_generate=True)
        calls.append((kw["input_ids"], kw["attention_mask"], out))
        return out.sequences

    backend.model.generate = recording_generate
    traces = {}
    try:
        for r in reqs:
            (c,) = backend.generate([r])
            t = Trace(text=c.texts[0] if c.ok else None, error=c.error)
            if c.ok:
                ids, mask, out = calls[-1]
                prompt = ids[0][mask[0].bool()].tolist()
                new = out.sequences[0, ids.shape[1]:].tolist()
                eos = backend.model.generation_config.eos_token_id
                eos = set(eos if isinstance(eos, list) else [eos])
                stop = next((j for j, tok in enumerate(new) if tok in eos), None)
                new = new[: stop + 1] if stop is not None else new
                lp = [torch.log_softmax(out.logits[j][0].float(), -1)[tok].item() for j, tok in enumerate(new)]
                t.prompt_ids, t.output_ids, t.logprobs = prompt, new, lp
            traces[r.id] = t
    finally:
        backend.model.generate = generate
    return traces


def vllm_traces(backend, reqs: list[Request]) -> dict[str, Trace]:
    """Run ``reqs`` one at a time through a ``vllm`` backend, recording the ``RequestOutput`` its engine call returned
    (``LLM.chat`` for images and text, ``LLM.generate`` for video), with the sampled tokens' log-probabilities."""
    seen = []
    originals = {name: getattr(backend.llm, name) for name in ("chat", "generate")}

    def recording(name):
        def call(prompts, params, *a, **kw):
            for p in params if isinstance(params, list) else [params]:
                p.logprobs = 0  # the sampled token's log-probability only
            outs = originals[name](prompts, params, *a, **kw)
            seen.extend(outs)
            return outs
        return call

    for name in originals:
        setattr(backend.llm, name, recording(name))
    traces = {}
    try:
        for r in reqs:
            n_seen = len(seen)
            (c,) = backend.generate([r])
            t = Trace(text=c.texts[0] if c.ok else None, error=c.error)
            if c.ok and len(seen) > n_seen:
                o = seen[-1]
                t.prompt_ids = list(o.prompt_token_ids)
                t.output_ids = list(o.outputs[0].token_ids)
                t.logprobs = [step[tok].logprob for step, tok in zip(o.outputs[0].logprobs, t.output_ids, strict=True)]
            traces[r.id] = t
    finally:
        for name, fn in originals.items():
            setattr(backend.llm, name, fn)
    return traces


def agreement(a: dict[str, Trace], b: dict[str, Trace], *, skip_prompt_prefix: int = 0) -> dict:
    """Compare two engines' traces on the same requests: per request, prompt ids equal (after dropping
    ``skip_prompt_prefix`` leading ids of ``a``), the number of leading generated ids they share, and the largest
    gap between their log-probabilities of the shared tokens."""
    rows = {}
    for rid in a:
        x, y = a[rid], b.get(rid)
        if y is None or x.error or y.error:
            rows[rid] = {"error": x.error or (y.error if y else "missing")}
            continue
        same = 0
        for p, q in zip(x.output_ids, y.output_ids, strict=False):
            if p != q:
                break
            same += 1
        gap = max((abs(p - q) for p, q in zip(x.logprobs[:same], y.logprobs[:same], strict=True)), default=0.0)
        rows[rid] = {"prompt_equal": x.prompt_ids[skip_prompt_prefix:] == y.prompt_ids, "prompt_len": len(y.prompt_ids),
                     "steps": len(x.output_ids), "same_steps": same,
                     "identical": x.output_ids == y.output_ids, "max_logprob_gap": gap}
    return rows
