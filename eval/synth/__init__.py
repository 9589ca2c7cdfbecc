"""The simulator-backed synthetic PSR benchmark: the toolkit's embedded default dataset.

``build_benchmark(out_dir, preset="demo", videos=None, query_videos=None, seed=0)`` simulates 2D rigid-body scenes
with pymunk, labels each object's timed trajectory of true states from the simulator record, describes every state in
free-form words, renders frames with Pillow and writes a benchmark directory in the format of `eval.schema`
(queries, corpus with raw descriptions, states, frames, the ``pixels`` and ``sim`` feature spaces, ``sim/*.npz``):
step 1 of the construction, which ``python -m retrieval synth`` follows with the canonicalization.
Command line: ``python -m eval synth --out DIR [--preset demo|psr] [--videos N] [--query-videos N] [--seed S]``.

- Scene families (`eval.synth.scenes.families`): ``ramp``, ``table_push``, ``dominoes``, ``container``, ``stack``,
  ``shelf``, ``billiards``; each registered with `eval.synth.scenes.family`.
- Source domains (`eval.synth.scenes.DOMAINS`): ``workshop``, ``kitchen``, ``playroom``, ``warehouse``; video ``i``
  belongs to domain ``i % 4`` and draws its family from that domain's mixture.
- Presets (`eval.synth.build.PRESETS`): ``demo`` (the default) simulates 1080 videos, every one with queries, frames
  160 x 120; ``psr`` simulates 13700 videos, 1550 of them with queries, frames 80 x 60. ``videos`` and
  ``query_videos`` override a preset's sizes; the output is byte-identical for a configuration and seed.

Modules: `scenes` (the family registry, the world and the builders), `surfaces` (the piece kinds objects touch and
rest on), `record` (the simulator record and its npz), `states` (labelling thresholds and smoothing), `lexicon`
(subjects, the true state, the corpus and held-out describers), `paraphrase` (held-out paraphrases), `prefix` (where
prefixes end), `questions` (templates), `render` (looks, frames, pixel features), `simspace` (the ``sim`` prefix
space), `video` (one video end to end), `build` (assembly and writing), `pairs` (training triples for the
canonicalization encoder, from a disjoint world).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eval.synth.build import build_benchmark

__all__ = ["build_benchmark"]


def __getattr__(name: str):
    # Lazy, so the vocabulary modules (`lexicon`, `paraphrase`) that canonicalization uses on any benchmark import
    # without pymunk (the `synth` extra), which only the builder needs.
    if name == "build_benchmark":
        from eval.synth.build import build_benchmark
        return build_benchmark
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
