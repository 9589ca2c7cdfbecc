"""The LoRA fine-tuned encoder baseline (paper App. S, Table 20): unfreeze the prefix encoder with LoRA and train
it end-to-end through the LFTR head, against a frozen-encoder run of the same job as the control.

- **LoRA run**: the prefix space's image tower (the model recorded in its ``meta.json``, e.g. the SSL or LiT
  tower) gets peft LoRA adapters (``r`` 16, ``alpha`` 32, dropout 0.1, on the attention's ``q_proj`` /
  ``k_proj`` / ``v_proj``, plus ``o_proj`` when ``with_out`` — the paper adds "out" for its CLIP tower); every base
  weight stays frozen. Each training step encodes the batch's 8 prefix frames with it,
  ``tokens = normalise(pooler_output)`` (exactly what ``retrieval encode`` stores), and the InfoNCE + grounding
  loss of the LFTR head (`retrieval.lftr.train`) trains head and adapters together (batch 64, 15 epochs by
  default). Before each validation and for prediction the prefix tokens of the evaluated queries are recomputed
  with the adapted encoder.
- **Frozen control**: the same job with the encoder frozen. A frozen encoder's tokens are the space's precomputed
  ``prefixes`` table, so the control reads them from it (the table equals a fresh encode up to float rounding,
  checked by the tests) and is, by construction, plain LFTR with the same config, seed and data.

`run_lora_baseline` trains both into ``OUT/frozen`` and ``OUT/lora``, writes each test run, and compares them in
``OUT/comparison.{json,md}``: R@5 of each, the paired bootstrap and McNemar test of their per-query hits
(`eval.stats`), and the cost ratio (training seconds per epoch, LoRA / frozen; peak memory).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from eval.benchmark import Benchmark
from eval.errors import InputError
from eval.io import write_json
from eval.schema import PREFIX_FRAMES
from retrieval.lftr.config import LFTRConfig
from retrieval.lftr.train import Prepared, train


@dataclass
class LoRAConfig:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.1
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")
    with_out: bool = False  # also adapt the attention output projection (the paper's CLIP row)

    @property
    def target_modules(self) -> list[str]:
        return list(self.targets) + (["o_proj"] if self.with_out else [])


#: LFTR settings of the baseline that differ from the head's own config (paper: batch 64, ~15 epochs).
LORA_LFTR = {"batch_size": 64, "epochs": 15}


def encoder_path(prep: Prepared) -> str:
    """The image model that produced the prefix space (its ``meta.json`` ``model``)."""
    from retrieval.encoders import resolve_model

    model = prep.prefix_space.meta.get("model", "")
    if not model or prep.prefix_space.kind != "visual":
        raise InputError(f"prefix space {prep.prefix_space.name!r} was not encoded by an image model "
                         f"(meta model {model!r}); the LoRA baseline needs one (`retrieval encode --model DIR`)")
    return resolve_model(model)


def prefix_pixels(prep: Prepared, processor) -> torch.Tensor:
    """``(n_prefixes, 8, 3, H, W)`` float32: every prefix's frames through the encoder's image processor, in the
    order of the prefix space's ``prefixes`` table."""
    from eval.images import load_view
    from retrieval.encode import _prefix_frames

    bench = prep.bench
    crop = prep.prefix_space.meta.get("crop") == "object"  # see the prefix space as encode saw it
    pids, frames = _prefix_frames(bench, crop)
    by_id = dict(zip(pids, frames, strict=True))
    ids = prep.prefix_space.prefixes.ids
    missing = [p for p in ids if p not in by_id]
    if missing:
        raise InputError(f"prefix {missing[0]!r} of space {prep.prefix_space.name!r} is not in the benchmark")
    out = []
    for p in ids:
        imgs = [load_view(bench.path(f), b) for f, b in by_id[p]]
        out.append(processor(images=imgs, return_tensors="pt")["pixel_values"])
    return torch.stack(out).float()


class LoRAPrefixEncoder:
    """A `retrieval.lftr.train.PrefixAdapter`: the prefix space's tower with peft LoRA adapters."""

    def __init__(self, prep: Prepared, device: str, cfg: LoRAConfig, *, chunk: int = 512):
        from peft import LoraConfig, get_peft_model
        from transformers import AutoImageProcessor, AutoModel

        path = encoder_path(prep)
        base = AutoModel.from_pretrained(path, dtype=torch.float32)
        self.module = get_peft_model(base, LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                                      target_modules=cfg.target_modules, bias="none")).to(device)
        self.pixels = prefix_pixels(prep, AutoImageProcessor.from_pretrained(path)).to(device)
        self.device, self.chunk = device, chunk
        self.fingerprint = hashlib.sha1(repr((path, asdict(cfg))).encode()).hexdigest()[:12]

    def _encode(self, pv: torch.Tensor) -> torch.Tensor:
        out = self.module(pixel_values=pv)
        return F.normalize(out.pooler_output.flatten(1), dim=-1)

    def tokens(self, prefix_rows: torch.Tensor) -> torch.Tensor:
        pv = self.pixels[prefix_rows]  # (B, 8, 3, H, W)
        b = pv.shape[0]
        return self._encode(pv.flatten(0, 1)).view(b, PREFIX_FRAMES, -1)

    @torch.no_grad()
    def refresh(self, prep: Prepared, rows: np.ndarray) -> None:
        prefix_rows = np.unique(prep.data.prefix_row[rows])
        for s in range(0, len(prefix_rows), max(1, self.chunk // PREFIX_FRAMES)):
            r = prefix_rows[s:s + max(1, self.chunk // PREFIX_FRAMES)]
            tok = self.tokens(torch.from_numpy(r).to(self.device))
            prep.data.prefix[r] = tok.cpu().numpy()


def lora_factory(cfg: LoRAConfig) -> Callable[[Prepared, str], LoRAPrefixEncoder]:
    return lambda prep, device: LoRAPrefixEncoder(prep, device, cfg)


def predict_lora_run(bench: Benchmark, ckpt_dir: Path, out: Path, lora: LoRAConfig | None, *, split: str = "test",
                     method: str = "", progress: bool = True):
    """Write the test run of a checkpoint trained by `run_lora_baseline` (adapters loaded when ``lora``)."""
    from retrieval.encoders import pick_device
    from retrieval.lftr.jobs import _predict_run
    from retrieval.lftr.train import load_checkpoint, prepare, torch_threads

    ck_model, cfg, ck = load_checkpoint(ckpt_dir)
    device = pick_device(cfg.device or None)
    with torch_threads(cfg.threads):
        prep = prepare(bench, cfg, ckpt_dir, device)
        if lora is not None:
            adapter = LoRAPrefixEncoder(prep, device, lora)
            adapter.module.load_state_dict(ck["adapter"])
            adapter.module.eval()
            adapter.refresh(prep, bench.query_rows(split))
        return _predict_run(bench, ck_model.to(device), cfg, ck, ckpt_dir, out, split=split, read_rule=None,
                            method=method, k=50, device=device, progress=progress, prep=prep)


def run_lora_baseline(bench: Benchmark, cfg: LFTRConfig, lora: LoRAConfig, out: str | Path, *,
                      split: str = "test", log=print, progress: bool = True, runs: tuple[str, ...] = ("frozen", "lora"),
                      resamples: int = 10_000) -> dict:
    """Train the frozen control and the LoRA run into ``out/frozen`` and ``out/lora`` (each resumable), write their
    runs on ``split`` and the comparison (module docstring). Returns the comparison dict."""
    from eval.runs import read_run
    from retrieval.lftr.predict import validation_recall
    from retrieval.towers import peak_rss_mb

    out = Path(out)
    res: dict = {"config": cfg.to_dict(), "lora_config": {**asdict(lora), "target_modules": lora.target_modules},
                 "split": split}
    for name in runs:
        d = out / name
        t0 = time.time()
        summary = train(bench, cfg, d, validate=validation_recall, log=log, progress=progress,
                        adapter_factory=lora_factory(lora) if name == "lora" else None)
        run_path = d / "run.parquet"
        label = f"lftr[{cfg.target_space}]+{'lora' if name == 'lora' else 'frozen'}"
        run = read_run(run_path) if run_path.exists() else predict_lora_run(
            bench, d, run_path, lora if name == "lora" else None, split=split, method=label, progress=progress)
        hist = summary["history"]
        res[name] = {"run": str(run_path), "seconds_per_epoch": float(np.mean([h["train_seconds"] for h in hist])),
                     "val_seconds_per_epoch": float(np.mean([h.get("val_seconds", 0.0) for h in hist])),
                     "cpu_seconds_per_epoch": float(np.mean([h.get("train_cpu_seconds", np.nan) for h in hist])),
                     "load_avg": float(np.mean([h.get("load_avg", 0.0) for h in hist])),
                     "best_val": summary["best_val"], "wall_seconds": time.time() - t0, "peak_rss_mb": peak_rss_mb(),
                     "parameters": summary["parameters"], "hits": _hits(run)}
        log(f"{name}: R@5 {100 * np.nanmean(res[name]['hits']):.2f}, {res[name]['seconds_per_epoch']:.1f} s/epoch")
    if all(n in res for n in ("frozen", "lora")):
        res["comparison"] = compare(res["lora"]["hits"], res["frozen"]["hits"], resamples=resamples)
        res["comparison"]["cost_ratio"] = res["lora"]["seconds_per_epoch"] / max(res["frozen"]["seconds_per_epoch"],
                                                                                1e-9)
    for n in ("frozen", "lora"):
        if n in res:
            res[n]["R@5"] = float(np.nanmean(res[n]["hits"]))
            res[n]["hits"] = [None if np.isnan(x) else float(x) for x in res[n]["hits"]]
    write_json(out / "comparison.json", res)
    (out / "comparison.md").write_text(comparison_markdown(res), encoding="utf-8")
    return res


def _hits(run) -> np.ndarray:
    """Per-query tie-aware expected hit@5 of the main pool (NaN without GT)."""
    from eval.metrics import RankStats, recall_at_k

    return recall_at_k(RankStats.from_run(run, "type2-all"), 5)


def compare(a, b, *, resamples: int = 10_000) -> dict:
    """R@5 difference ``a - b`` over the queries with GT: paired bootstrap and tie-aware McNemar of the expected
    hits (`eval.stats.paired_bootstrap`, `eval.stats.mcnemar`, as ``eval report`` uses them)."""
    from eval.stats import mcnemar, paired_bootstrap

    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a) & np.isfinite(b)
    boot = paired_bootstrap(a[ok], b[ok], n_resamples=resamples)
    mc = mcnemar(a[ok], b[ok], n_resamples=resamples)
    return {"n": int(ok.sum()), "bootstrap": boot.to_dict(), "mcnemar": mc.to_dict()}


def comparison_markdown(res: dict) -> str:
    lines = ["| run | R@5 | s/epoch (train, wall) | CPU s/epoch | load avg | peak RSS (MB) |",
             "|---|---:|---:|---:|---:|---:|"]
    for n in ("frozen", "lora"):
        if n in res:
            r = res[n]
            lines.append(f"| {n} | {100 * r['R@5']:.2f} | {r['seconds_per_epoch']:.1f} | "
                         f"{r.get('cpu_seconds_per_epoch', float('nan')):.1f} | {r['load_avg']:.1f} | "
                         f"{r['peak_rss_mb']:.0f} |")
    c = res.get("comparison")
    if c:
        b = c["bootstrap"]
        p = lambda x: "n too small" if x is None else f"{x:.3g}"  # noqa: E731
        lines += ["", f"LoRA - frozen: ΔR@5 {100 * b['delta']:+.2f} pp, 95% CI [{100 * b['ci_low']:+.2f}, "
                      f"{100 * b['ci_high']:+.2f}], paired bootstrap p = {p(b['p_value'])}; McNemar p = "
                      f"{p(c['mcnemar']['p_value'])} (n = {c['n']}); cost ratio {c['cost_ratio']:.1f}x s/epoch."]
    return "\n".join(lines) + "\n"
