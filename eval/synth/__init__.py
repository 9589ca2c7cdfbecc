"""The simulator-backed synthetic PSR benchmark: the toolkit's embedded default dataset.

``build_benchmark(out_dir, videos=300, seed=0)`` simulates 2D rigid-body scenes with pymunk in four scene
families (``ramp``, ``table_push``, ``dominoes``, ``container``: the source domains), labels each object's
timed state trajectory from the simulator record, renders frames with Pillow and writes a benchmark directory in
the format of `eval.schema` (queries, corpus, states, frames, the ``pixels`` feature space, ``sim/*.npz``).
Command line: ``python -m eval synth --out DIR [--videos N] [--seed S]``.

Modules: `scenes` (the families), `record` (the simulator record and its npz), `states` (labelling thresholds and
smoothing), `vocab` (subjects, canonical states, synonyms, similarity map), `render` (looks, frames, pixel
features), `questions` (templates), `video` (one video end to end), `build` (assembly and writing).
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
