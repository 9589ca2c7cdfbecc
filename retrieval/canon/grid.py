r"""Machine-independent embeddings for the benchmark build: every float-sensitive decision made on a grid.

The build (`retrieval.canon.apply`) decides with cosines: greedy clustering at ``t`` (``sim >= t``, the best seed),
the ``bge_similar`` neighbours (``sim >= t - 0.10``), the mining order of candidates (cosine to the target segment,
most similar first). float32 sentence embeddings are not the same on every machine: another CPU, BLAS kernel or
thread count changes their last bits (measured here on a 463-phrase vocabulary with MiniLM: ``ATEN_CPU_CAPABILITY=
default``, ``MKL_CBWR=COMPATIBLE`` or ``DNNL_MAX_CPU_ISA=SSE41`` each changed every row, by up to 1.3e-7), and
decisions near a threshold or between near-equal candidates flip with them. Rounding those float32 values to a
coarser grid does not help: a value next to a rounding boundary still flips (171 of the 463 rows still differed
after rounding to 2^-16).

So the build embeds in float64 -- the same model and weights run in double precision, where the machines' results
differ by ~4e-16 -- and then rounds each L2-normalised row to the grid of multiples of ``2^-GRID_BITS`` (`snap`;
a value exactly halfway rounds to even). A row then differs between two machines only if one of its values lies
within ~1e-15 of a grid midpoint, about one row in 10^7. Measured: the float64 embeddings under the settings above
and with 1 vs 2 threads differed by up to 3.9e-16 and their grid values not at all
(``tests/retrieval/canon/test_canon_grid.py`` repeats this in subprocesses).

On the grid every product of two coordinates is a multiple of ``2^-2 GRID_BITS`` below 1 and a dot product of ``d``
of them needs at most ``2 GRID_BITS + log2(d)`` significant bits, fewer than float64's 53: cosines of grid rows are
exact in any summation order (a BLAS product, `retrieval.canon.cluster.exact_dots`), so ties are exact ties and are
broken by the documented rules (the earliest seed; the lower corpus row). The rounding moves a coordinate by at most
``2^-(GRID_BITS+1)`` (7.6e-6): a cosine by ~1e-5, far below any threshold step that matters.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from eval.errors import InputError

#: The grid of build embeddings: multiples of 2^-GRID_BITS.
GRID_BITS = 16
GRID = 2.0 ** -GRID_BITS


def snap(emb: np.ndarray) -> np.ndarray:
    """``(n, d)`` rows L2-normalised in float64 and rounded to multiples of `GRID` (half to even), as float32
    (exactly: grid values need at most 17 significant bits). Raises `ValueError` for a zero or non-finite row."""
    x = np.asarray(emb, np.float64)
    if x.ndim != 2:
        raise InputError(f"embeddings must be (n, d), got shape {x.shape}")
    norm = np.sqrt(np.einsum("ij,ij->i", x, x))
    if not np.isfinite(norm).all() or (norm == 0).any():
        bad = int(np.flatnonzero(~np.isfinite(norm) | (norm == 0))[0])
        raise InputError(f"embedding row {bad} is zero or not finite: cannot normalise")
    return (np.round(x / norm[:, None] / GRID) * GRID).astype(np.float32)


def grid_embeddings(encoder, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
    """Embeddings of ``texts`` on the grid (module docstring): a sentence-transformers `retrieval.encoders.TextEncoder`
    runs in float64 for the call (its weights cast up and back, losslessly); any other encoder's ``encode_items``
    output is snapped as it is."""
    model = getattr(encoder, "model", None)
    if model is None or not hasattr(model, "encode_document"):
        return snap(encoder.encode_items(texts, progress=progress))
    import torch

    if len(texts) == 0:
        return np.zeros((0, encoder.dim), np.float32)
    dtype = next(model.parameters()).dtype
    model.to(torch.float64)
    try:
        out = model.encode_document(list(texts), batch_size=encoder.batch_size, show_progress_bar=progress,
                                    convert_to_numpy=True, normalize_embeddings=False)
    finally:
        model.to(dtype)
    return snap(out)


#: Folder of `cached_grid_embeddings`'s files under a benchmark's ``.cache``.
CACHE_NAME = "canon-grid"


def grid_cache_key(texts: Sequence[str], model: str, batch_size: int) -> str:
    """What `grid_embeddings` of ``texts`` depends on, hashed: the texts in order, ``model``'s weights
    (`retrieval.textcache.model_fingerprint`), the batch size, the grid and torch's version."""
    import hashlib
    import json

    import torch

    from retrieval.textcache import model_fingerprint, text_keys

    h = hashlib.sha256(json.dumps([GRID_BITS, model, model_fingerprint(model), batch_size, torch.__version__])
                       .encode())
    for k in text_keys(texts):
        h.update(k)
    return h.hexdigest()[:32]


def cached_grid_embeddings(encoder, texts: Sequence[str], model: str, cache: str | os.PathLike | None, *,
                           progress: bool = False) -> tuple[np.ndarray, str]:
    """`grid_embeddings` of ``texts`` by ``encoder`` (of ``model``), read from ``cache/<key>.npy`` when an earlier
    call stored the same list there (`grid_cache_key`), else computed and stored; returns ``(embeddings, key)``.
    The whole list is one entry, so a hit returns exactly what the same call computes. ``cache=None``: computed."""
    key = grid_cache_key(texts, model, getattr(encoder, "batch_size", 0))
    path = None if cache is None else Path(cache) / f"{key}.npy"
    if path is not None and path.is_file():
        try:
            emb = np.load(path, allow_pickle=False)
            if emb.shape[0] == len(texts):
                return emb, key
        except (OSError, ValueError):
            pass  # a damaged entry is computed again and replaced
    emb = grid_embeddings(encoder, texts, progress=progress)
    if path is not None:
        store_grid_embeddings(emb, path.parent, key)
    return emb, key


def store_grid_embeddings(emb: np.ndarray, cache: str | os.PathLike, key: str) -> None:
    """Write ``emb`` as ``cache/<key>.npy`` (atomically; a cache that cannot be written is skipped)."""
    from eval.io import atomic_path

    try:
        Path(cache).mkdir(parents=True, exist_ok=True)
        with atomic_path(Path(cache) / f"{key}.npy") as tmp, open(tmp, "wb") as fh:
            np.save(fh, emb)
    except OSError:
        pass
