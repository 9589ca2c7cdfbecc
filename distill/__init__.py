"""Chain-of-thought distillation of PSR students (DynaPix §5.1, paper 004), grounded in the benchmark's truth.

Stages (each a module with a config dataclass and a ``python -m distill <command>``):

- `distill.predicates` (+ `distill.motion` on the synthetic benchmark; records in `distill.facts`): oracle ->
  qualitative evidence predicates;
- `distill.validator` (phrase matching in `distill.lexicon`): rejects rationales with numbers, frame indices,
  post-horizon information, contradictions of the predicates, announced answers, degenerate wording, a bad length
  or answer line;
- `distill.narrate`: teacher narration through `forecasters` backends (resampled until valid), or the deterministic
  template narrator (and its noisy stand-in for a teacher); the SFT targets of the CoT, answer-only and
  trajectory-labels variants;
- `distill.rationale_stats`: answer restatements, leakage probes and validator rejects of narrations;
- `distill.sft`: CoT and answer-only SFT datasets in TRL's vision-language format, as Parquet;
- `distill.train`: LoRA / QLoRA SFT with TRL + accelerate (``accelerate launch -m distill.train --config ...``;
  arguments: `distill.train_args`, TRL's flags through `trl.TrlParser`; eval: `distill.train_eval`; outputs and
  resumption: `distill.checkpoints`);
- `distill.faithfulness`: SCOTT-style check that answers follow counterfactual evidence;
- `distill.answers`: answer accuracy of phrase files (exact and snapped reads) with video-clustered significance.

Students are served by `forecasters` (``--forecaster student --adapter DIR``). Nothing is imported at package import.
"""
