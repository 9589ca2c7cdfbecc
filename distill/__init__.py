"""Chain-of-thought distillation of PSR students (DynaPix §5.1, paper 004), grounded in the benchmark's truth.

Stages (each a module with a config dataclass and a ``python -m distill <command>``):

- `distill.predicates` (+ `distill.motion` on the synthetic benchmark): oracle -> qualitative predicates;
- `distill.validator`: rejects rationales with numbers, post-horizon information, a bad length or answer line;
- `distill.narrate`: teacher narration through `forecasters` backends (resampled until valid), or the deterministic
  template narrator;
- `distill.sft`: CoT and answer-only SFT datasets in TRL's vision-language format, as Parquet;
- `distill.train`: LoRA / QLoRA SFT with TRL + accelerate (``accelerate launch -m distill.train --config ...``;
  arguments: `distill.train_args`, TRL's flags through `trl.TrlParser`; eval: `distill.train_eval`);
- `distill.faithfulness`: SCOTT-style check that answers depend on rationales;
- `distill.answers`: answer accuracy of phrase files (exact and snapped reads) with video-clustered significance.

Students are served by `forecasters` (``--forecaster student --adapter DIR``). Nothing is imported at package import.
"""
