"""The ``hf`` backend: transformers in process, for small models and CPU.

Loads ``AutoModelForImageTextToText`` when the checkpoint has a vision tower, else ``AutoModelForCausalLM``, with
its processor (`forecasters.backends.hf_loading.load_processor`). Frames arrive already resized to the run's
``max_pixels`` (the pixel policy in `forecasters.presets`); ``max_pixels`` and ``min_pixels`` also go to the image
processor, so it neither shrinks nor enlarges them on its own: a frame gets the image tokens its size gives, as in
training (`distill.train` builds its processor with the same caps). A LoRA adapter (``HFConfig.adapter``, a
local directory) is applied unmerged with peft.

A student trained by ``distill.train`` carries ``psr_student.json`` (in its adapter directory, or in the model
directory of a full fine-tuning) with its preprocessing. The backend refuses caps that differ from it
(`StudentPreprocessing.check_caps`) and, on the first request with images, compares the image tokens the processor
actually makes per frame with the ones the student was trained on (``image_tokens_per_frame``): a mismatch raises
`PreprocessingMismatch` naming both counts, so a student is never served, or faithfulness-tested, on other image
tokens than it saw.

Requests are generated in batches of ``batch_size`` with left padding: ``model.generate`` greedy when temperature is
0, else sampling with ``num_return_sequences = n``, seeded by ``torch.manual_seed(seed)`` before each batch.
Token counts: ``prompt_tokens`` = non-padding prompt tokens; ``completion_tokens`` = generated tokens up to and
including the end-of-sequence token, summed over samples.

Scoring (`HFBackend.score`, the ``likelihood`` forecaster): per `ScoreRequest`, one forward pass over the shared
prompt (images included; `forecasters.backends.scoring` says where the answers' tokens start) keeps its KV cache
and the log-probabilities at its last position; the answers then go through in batches of
``candidate_batch_size``, each batch one forward pass of its answer tokens (right-padded, so padding never reaches
a real token under causal attention) on a copy of that cache repeated over the batch. Answer ``a`` scores
``sum_i log_softmax(z_{i-1})[a_i]`` over its tokens, ``z_{i-1}`` the logits at the position before token ``a_i``
(float32). Memory per batch: the prompt's KV cache times the batch size.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import time
from dataclasses import dataclass

from eval.errors import EngineError, InputError, loading_model
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
from forecasters.backends.hf_loading import is_vision_config, load_processor
from forecasters.backends.scoring import answer_spans, render_answers

#: processor outputs laid out per token (sliced when the shared prefix is cut short)
_PER_TOKEN_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")

log = logging.getLogger(__name__)

#: The preprocessing record of a student trained by ``distill.train`` (the adapter's or full model's directory).
STUDENT_INFO = "psr_student.json"


class PreprocessingMismatch(UnsupportedInput):
    """The served student would see other image tokens (or caps) than it was trained on."""


class StudentPreprocessing:
    """``psr_student.json``'s ``preprocessing`` of the served student (``None`` fields when there is none)."""

    def __init__(self, record: dict | None, where: str | None):
        pre = (record or {}).get("preprocessing") or {}
        self.where = where
        self.max_pixels = pre.get("max_pixels")
        self.min_pixels = pre.get("min_pixels")
        self.tokens = [float(t) for t in pre.get("image_tokens_per_frame") or []]

    @classmethod
    def find(cls, model: str, adapter: str | None) -> StudentPreprocessing:
        """The record of ``adapter``, else of a local ``model`` directory, else an empty one."""
        import json
        from pathlib import Path

        for d in (adapter, model):
            f = Path(d) / STUDENT_INFO if d else None
            if f is not None and f.is_file():
                return cls(json.loads(f.read_text(encoding="utf-8")), str(f))
        return cls(None, None)

    def check_caps(self, max_pixels: int | None, min_pixels: int | None) -> None:
        """The run's pixel caps agree with the trained ones (a cap the run leaves unset takes the trained one)."""
        for name, have, want in (("max_pixels", max_pixels, self.max_pixels),
                                 ("min_pixels", min_pixels, self.min_pixels)):
            if have is not None and want is not None and have != want:
                raise PreprocessingMismatch(f"{name} {have} differs from the student's training preprocessing "
                                            f"({name} {want}, {self.where})")

    def check_tokens(self, per_frame: list[float]) -> None:
        """Each request's image tokens per frame (as processed) is one the student was trained on."""
        if not self.tokens or not per_frame:
            return
        bad = sorted({round(t, 3) for t in per_frame if not any(abs(t - w) < 1e-6 for w in self.tokens)})
        if bad:
            raise PreprocessingMismatch(f"the processor makes {bad} image tokens per frame, the student was trained "
                                        f"on {self.tokens} ({self.where}): other frame sizes or pixel caps than in "
                                        "training")


@dataclass
class HFConfig(BackendConfig):
    """The ``hf`` backend's settings (`BackendConfig`'s, and): ``dtype`` (``auto``: bf16 on CUDA, float32 on CPU),
    ``device`` (``auto`` / ``cpu`` / ``cuda``), ``trust_remote_code``, ``min_pixels`` (the Qwen-VL processor's
    floor), ``num_threads`` (torch CPU threads; None: torch's default), ``candidate_batch_size`` (answers per
    forward pass on the shared prompt's KV cache when scoring)."""

    dtype: str = "auto"
    device: str = "auto"
    trust_remote_code: bool = False
    min_pixels: int | None = None
    num_threads: int | None = None
    candidate_batch_size: int = 32


class HFBackend(Backend):
    name = "hf"
    supports_images = True
    supports_video = True
    supports_scoring = True
    config_class = HFConfig

    def __init__(self, config: HFConfig):
        super().__init__(config)
        from eval.threads import prefer_passive_wait

        # before torch loads: OpenMP workers that wait sleep instead of spinning (eval.threads); decoding runs many
        # short parallel regions, which spinning workers slow most on a shared CPU
        self.passive_wait = prefer_passive_wait()
        import torch
        import transformers
        from transformers import AutoConfig

        self._torch = torch
        cfg = config
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
        if cfg.dtype == "auto":
            self.dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        else:
            self.dtype = getattr(torch, cfg.dtype)
        with loading_model(cfg.model):
            hf_config = AutoConfig.from_pretrained(cfg.model, trust_remote_code=cfg.trust_remote_code)
        self.is_vlm = is_vision_config(hf_config)
        self.trained = StudentPreprocessing.find(cfg.model, cfg.adapter)
        self.trained.check_caps(cfg.max_pixels, cfg.min_pixels)
        max_px = cfg.max_pixels or self.trained.max_pixels
        min_px = cfg.min_pixels or self.trained.min_pixels
        proc_kwargs = {k: v for k, v in (("max_pixels", max_px), ("min_pixels", min_px)) if v}
        with loading_model(cfg.model):
            self.processor = load_processor(cfg.model, trust_remote_code=cfg.trust_remote_code,
                                            **(proc_kwargs if self.is_vlm else {}))
        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        auto = transformers.AutoModelForImageTextToText if self.is_vlm else transformers.AutoModelForCausalLM
        with loading_model(cfg.model):
            model = auto.from_pretrained(cfg.model, dtype=self.dtype, trust_remote_code=cfg.trust_remote_code)
        if cfg.adapter:
            from peft import PeftModel

            with loading_model(cfg.adapter, flag="--adapter"):
                model = PeftModel.from_pretrained(model, cfg.adapter)  # unmerged: base weights stay as loaded
        self.model = model.to(self.device).eval()
        self._transformers_version = transformers.__version__

    @functools.cached_property
    def engine_version(self) -> str:
        return f"transformers {self._transformers_version} (torch {self._torch.__version__}, {self.device})"

    def close(self) -> None:
        self.model = None

    # --- prompt building ---
    def _content(self, request: Request) -> list[dict]:
        content = []
        for p in request.parts:
            if isinstance(p, str):
                content.append({"type": "text", "text": p})
            elif isinstance(p, ImagePart):
                content.append({"type": "image"})
            elif isinstance(p, VideoPart):
                content.append({"type": "video"})
        return content

    def chat_messages(self, request: Request) -> list[dict]:
        """The request as chat messages for the model's chat template (system, then the user turn)."""
        if not self.is_vlm and (request.images or request.videos):
            raise UnsupportedInput(f"{self.config.model} is a text-only model; it cannot take images or video")
        msgs = [{"role": "system", "content": request.system}] if request.system else []
        user = request.text if not self.is_vlm else self._content(request)
        msgs.append({"role": "user", "content": user})
        return msgs

    def chat_prompt(self, request: Request) -> str:
        """The request rendered by the model's chat template, up to the assistant turn (public: scoring a forced
        continuation, as the faithfulness check and the tiny-model fit do, appends to it)."""
        return self.processor.apply_chat_template(self.chat_messages(request), add_generation_prompt=True,
                                                  tokenize=False)

    def _encode(self, requests: list[Request]):
        return self.encode_prompts(requests, [self.chat_prompt(r) for r in requests])

    def encode_prompts(self, requests: list[Request], texts: list[str]):
        """Tokenize prompt ``texts`` (one per request, rendered by one template) with the requests' images / videos;
        left-padded tensors. The BOS is added where the template does not write it (`missing_bos`); a video goes
        with its metadata (`video_metadata`: its frames are the samples, at its frame rate)."""
        add_special = bool(texts) and missing_bos(self.tokenizer, texts[0])
        if not self.is_vlm:
            return self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=add_special)
        images = [p.image for r in requests for p in r.images]
        video_parts = [v for r in requests for v in r.videos]
        kwargs = {}
        if images:
            kwargs["images"] = images
        if video_parts:
            kwargs.update(videos=[[f.image for f in v.frames] for v in video_parts],
                          video_metadata=[video_metadata(v) for v in video_parts], do_sample_frames=False)
        enc = self.processor(text=texts, return_tensors="pt", padding=True, add_special_tokens=add_special, **kwargs)
        if images:
            self.trained.check_tokens(self.image_tokens_per_frame(requests, enc))
        return enc

    def image_tokens_per_frame(self, requests: list[Request], enc) -> list[float]:
        """Image tokens per image of each request with images, counted in the processed ``input_ids``."""
        tid = getattr(self.processor, "image_token_id", None)
        if tid is None and getattr(self.processor, "image_token", None):
            tid = self.tokenizer.convert_tokens_to_ids(self.processor.image_token)
        if tid is None:
            return []
        counts = (enc["input_ids"] == tid).sum(dim=1).tolist()
        return [c / len(r.images) for r, c in zip(requests, counts, strict=True) if r.images]

    # --- generation ---
    def _generate_many(self, requests: list[Request]) -> list[Completion]:
        torch = self._torch
        sp = requests[0].sampling
        inputs = self._encode(requests).to(self.device)
        gen = dict(max_new_tokens=sp.max_tokens, do_sample=not sp.greedy, num_return_sequences=sp.n,
                   pad_token_id=self.tokenizer.pad_token_id)
        if not sp.greedy:
            gen.update(temperature=sp.temperature, top_p=sp.top_p)
        if sp.seed is not None:
            torch.manual_seed(sp.seed)
        with torch.inference_mode():
            out = self.model.generate(**inputs, **gen)
        n_prompt = inputs["input_ids"].shape[1]
        new = out[:, n_prompt:]
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        prompt_lens = inputs["attention_mask"].sum(dim=1).tolist()
        comps = []
        for i, r in enumerate(requests):
            rows = new[i * sp.n:(i + 1) * sp.n]
            texts, n_tok, reasons = [], 0, []
            for row in rows.tolist():
                stop = next((j for j, t in enumerate(row) if t in eos_ids), None)
                kept = row[: stop + 1] if stop is not None else row
                n_tok += len(kept)
                reasons.append("stop" if stop is not None else "length")
                texts.append(self.tokenizer.decode(kept, skip_special_tokens=True))
            comps.append(Completion(request_id=r.id, texts=texts, prompt_tokens=int(prompt_lens[i]),
                                    completion_tokens=n_tok, finish_reasons=reasons))
        return comps

    def _generate_one(self, request: Request) -> Completion:
        return self._generate_many([request])[0]

    def _generate_batch(self, requests: list[Request]) -> list[Completion]:
        out: list[Completion] = []
        bs = max(1, self.config.batch_size)
        for i in range(0, len(requests), bs):
            chunk = requests[i:i + bs]
            same_sampling = all(r.sampling == chunk[0].sampling for r in chunk)
            try:
                if not same_sampling:
                    raise InputError("mixed sampling parameters in one batch")
                t0 = time.perf_counter()
                comps = self._generate_many(chunk)
                for c in comps:  # a request's latency is its batch's wall time
                    c.latency_s = time.perf_counter() - t0
                out.extend(comps)
            except Exception as e:  # isolate the failing request(s): each alone, with the base's failure records
                if len(chunk) > 1:
                    log.info("hf: batch of %d failed (%s); retrying one by one", len(chunk), e)
                out.extend(self._run_one(r) for r in chunk)
        return out

    # --- scoring (log-likelihood of answers; see the module docstring) ---
    @functools.cached_property
    def _forward_names(self) -> tuple[str, bool]:
        """(the forward's KV-cache keyword: ``cache`` where the installed transformers names it so, else
        ``past_key_values``; whether it takes ``logits_to_keep``)."""
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        params = inspect.signature(base.forward).parameters
        return ("cache" if "cache" in params else "past_key_values"), "logits_to_keep" in params

    @functools.cached_property
    def _rope_delta_modules(self) -> list:
        """Modules caching Qwen-VL's M-RoPE position offset of the last prompt (``rope_deltas``)."""
        return [m for m in self.model.modules() if hasattr(m, "rope_deltas")]

    def _prefix_forward(self, request: ScoreRequest, prefix_text: str, tok_prefix: list[int], shared: int):
        """Forward the first ``shared`` prompt tokens (images included) once: (KV cache, float32 log-probs of the
        next token at the last position, tokens in the prompt)."""
        torch = self._torch
        enc = self.encode_prompts([request.prompt], [prefix_text])  # as generation tokenizes the prompt
        n_full = enc["input_ids"].shape[1]
        cut = shared + (n_full - len(tok_prefix))  # image tokens are expanded inside the prompt, never after it
        if enc["input_ids"][0, cut:].tolist() != tok_prefix[shared:]:
            raise EngineError("the processor's tokens of the prompt do not end like the tokenizer's")
        inputs = {k: (v[:, :cut] if k in _PER_TOKEN_KEYS else v) for k, v in enc.items()}
        cache_kw, keep = self._forward_names
        for m in self._rope_delta_modules:  # M-RoPE offsets of the previous prompt must not shift this one's answers
            m.rope_deltas = None
        with torch.inference_mode():
            out = self.model(**{k: v.to(self.device) for k, v in inputs.items()}, use_cache=True,
                             **({"logits_to_keep": 1} if keep else {}))
        cache = getattr(out, "cache", None) or out.past_key_values
        return cache, torch.log_softmax(out.logits[0, -1].float(), -1), cut

    def _score_one(self, request: ScoreRequest) -> ScoreResult:
        torch = self._torch
        answers = list(request.continuations)
        tok = functools.partial(self.tokenizer.encode, add_special_tokens=False)
        prefix_text, full_texts = render_answers(self.processor.apply_chat_template,
                                                 self.chat_messages(request.prompt), answers)
        spans = answer_spans(tok, prefix_text, full_texts)
        shared = spans.shared
        cache, first_lp, n_prompt = self._prefix_forward(request, prefix_text, spans.prefix_ids, shared)
        cache_kw, _ = self._forward_names
        logprobs = [0.0] * len(answers)
        bs = max(1, self.config.candidate_batch_size)
        for a in range(0, len(answers), bs):
            idx = list(range(a, min(len(answers), a + bs)))
            suffixes = [spans.full_ids[j][shared:] for j in idx]
            width = max(len(x) for x in suffixes)
            ids = torch.full((len(idx), width), self.tokenizer.pad_token_id or 0, dtype=torch.long)
            for row, x in enumerate(suffixes):
                ids[row, :len(x)] = torch.tensor(x)
            batch_cache = copy.deepcopy(cache)
            batch_cache.batch_repeat_interleave(len(idx))
            with torch.inference_mode():  # no attention mask: right padding is invisible to real tokens (causal)
                out = self.model(input_ids=ids.to(self.device), use_cache=True, **{cache_kw: batch_cache})
            lp = torch.log_softmax(out.logits.float(), -1)
            for row, j in enumerate(idx):
                x, first = suffixes[row], spans.starts[j] - shared
                total = sum(float(lp[row, t - 1, x[t]]) for t in range(max(first, 1), len(x)))
                logprobs[j] = total + (float(first_lp[x[0]]) if first == 0 else 0.0)
        return ScoreResult(request_id=request.id, logprobs=logprobs,
                           n_tokens=[spans.n_tokens(j) for j in range(len(answers))], prompt_tokens=n_prompt)
