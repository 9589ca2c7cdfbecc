"""Text embeddings cached by content hash, so a stage that embeds texts it has embedded before (questions, oracle
texts, paraphrases, forecast phrases, the canonical states' phrasings that ``--canonicalize`` snaps to) neither
encodes them again nor loads the encoder at all.

`cached_query_encoder` wraps `retrieval.encoders.query_text_encoder`: ``encode_queries(texts)`` and
``encode_items(texts)`` look every text up by the SHA-256 of its UTF-8 bytes, encode only the distinct texts they
have not seen (the encoder is built on the first such miss, so a stage whose texts are all cached never imports
sentence-transformers), and add them to the store of their side. Other attributes are the wrapped encoder's.

Stores: ``<benchmark>/.cache/text-embeddings/<encoder key>.npz`` for the query side and ``<items key>.npz`` for the
corpus side (``keys`` uint8 ``(n, 32)``, ``vectors`` float32 ``(n, d)``), written atomically and merged with what
another process added meanwhile; a read-only benchmark keeps them under ``$XDG_CACHE_HOME/psr/text-embeddings``
(default ``~/.cache``). The encoder key is a SHA-256 of what chooses the query encoder in the space's ``meta.json``
(kind, model, query prompt, text tower and model) and of the model's files (relative path, size and modification
time of each) when the model is a local folder or the packaged MiniLM; a hub id is keyed by the snapshot it resolves
to in the local hub cache. The items key is the same without the query prompt (the corpus side encodes without it)
and with the side named. A retrained tower written to the same folder therefore gets new stores. A cached vector is
the one computed when the text was first seen (another batch may round the last bits differently).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from eval.io import atomic_path

#: ``meta.json`` fields that choose the query-side encoder (`retrieval.encoders.query_text_encoder`).
ENCODER_FIELDS = ("kind", "model", "query_prompt", "text_tower", "text_encoder", "text_model")


def model_fingerprint(model: str) -> str:
    """What identifies the weights behind ``model``: its files (relative path, size, mtime) when it resolves to a
    local folder, else the hub cache snapshot it resolves to (or the id itself when it is not cached)."""
    from retrieval.encoders import resolve_model

    if not model:
        return ""
    path = Path(resolve_model(model))
    if path.is_dir():
        stats = sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns)
                       for p in path.rglob("*") if p.is_file())
        return hashlib.sha256(json.dumps(stats).encode()).hexdigest()
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(str(model), "config.json")
        return str(hit) if isinstance(hit, str) else str(model)
    except Exception:  # noqa: BLE001 (no hub library or an odd id: the id names the model)
        return str(model)


def encoder_key(meta: dict, query_prompt: str | None = None, *, side: str = "queries") -> str:
    """SHA-256 (32 hex digits) of the encoder a space's ``meta`` (and a prompt override) selects for ``side``
    (``queries``, or ``items``: the corpus side, which no query prompt changes)."""
    if side not in ("queries", "items"):
        raise ValueError(f"side must be 'queries' or 'items', not {side!r}")
    fields = {f: meta.get(f) for f in ENCODER_FIELDS}
    if query_prompt is not None:
        fields["query_prompt"] = query_prompt
    if side == "items":
        del fields["query_prompt"]
        fields["side"] = side
    fields["weights"] = [model_fingerprint(str(meta.get(f) or "")) for f in ("model", "text_model")]
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:32]


def default_cache_dir(bench_root: str | os.PathLike | None, name: str = "text-embeddings") -> Path:
    """``<benchmark>/.cache/<name>`` when it can be written, else the user cache's ``psr/<name>``."""
    from eval.io import writable_dir

    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "psr" / name
    return writable_dir(Path(bench_root) / ".cache" / name if bench_root is not None else user, user)


def text_keys(texts: Sequence[str]) -> list[bytes]:
    return [hashlib.sha256(t.encode("utf-8")).digest() for t in texts]


class CachedQueryEncoder:
    """``encode_queries`` and ``encode_items`` through the content-hash stores (module docstring); the encoder is
    built on first need."""

    def __init__(self, meta: dict, cache_dir: str | os.PathLike, *, device: str | None = None,
                 query_prompt: str | None = None, build: Callable[[], Any] | None = None):
        self.meta, self.device, self.query_prompt = dict(meta), device, query_prompt
        self.path = Path(cache_dir) / f"{encoder_key(meta, query_prompt)}.npz"
        self.items_path = Path(cache_dir) / f"{encoder_key(meta, side='items')}.npz"
        self._encoder, self._build = None, build  # build: makes the encoder `meta` selects (default: its own way)
        self.hits = self.misses = 0  # texts served from the store / encoded, over this object's life

    @property
    def encoder(self):
        if self._encoder is None:
            if self._build is not None:
                self._encoder = self._build()
            else:
                from retrieval.encoders import query_text_encoder

                self._encoder = query_text_encoder(self.meta, device=self.device, query_prompt=self.query_prompt)
        return self._encoder

    def __getattr__(self, name: str) -> Any:  # dim, model, encode_items, ...: the wrapped encoder's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.encoder, name)

    @staticmethod
    def _load(path: Path) -> tuple[np.ndarray, np.ndarray]:
        if not path.exists():
            return np.zeros((0, 32), np.uint8), np.zeros((0, 0), np.float32)
        try:
            with np.load(path, allow_pickle=False) as z:
                return z["keys"], z["vectors"]
        except (OSError, ValueError, KeyError):  # a damaged store is only a cache: start a new one
            return np.zeros((0, 32), np.uint8), np.zeros((0, 0), np.float32)

    def _save(self, path: Path, keys: list[bytes], vectors: np.ndarray) -> None:
        old_keys, old_vecs = self._load(path)  # another process may have added texts since we read
        seen = {bytes(k) for k in old_keys}
        new = [i for i, k in enumerate(keys) if k not in seen]
        if not new:
            return
        add_keys = np.frombuffer(b"".join(keys[i] for i in new), np.uint8).reshape(-1, 32)
        if old_vecs.shape[1] not in (0, vectors.shape[1]):
            old_keys, old_vecs = add_keys[:0], vectors[:0]  # another width: the model changed under the key
        all_keys = np.concatenate([old_keys, add_keys]) if len(old_keys) else add_keys
        all_vecs = np.concatenate([old_vecs, vectors[new]]) if len(old_vecs) else vectors[new]
        with atomic_path(path, suffix=".npz") as tmp, open(tmp, "wb") as f:
            np.savez(f, keys=all_keys, vectors=np.ascontiguousarray(all_vecs, np.float32))

    def encode_queries(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """``(n, d)`` float32 query embeddings of ``texts``: cached ones read, the others encoded and stored."""
        return self._cached(texts, self.path, lambda t: self.encoder.encode_queries(t, progress=progress))

    def encode_items(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """``(n, d)`` float32 corpus-side embeddings of ``texts`` (the wrapped encoder's ``encode_items``): cached
        ones read, the others encoded and stored."""
        return self._cached(texts, self.items_path, lambda t: self.encoder.encode_items(t, progress=progress))

    def _cached(self, texts: Sequence[str], path: Path, encode) -> np.ndarray:
        texts = list(texts)
        keys = text_keys(texts)
        store_keys, store_vecs = self._load(path)
        index = {bytes(k): i for i, k in enumerate(store_keys)}
        missing: dict[bytes, str] = {}
        for k, t in zip(keys, texts, strict=True):
            if k not in index and k not in missing:
                missing[k] = t
        fresh = np.zeros((0, store_vecs.shape[1]), np.float32)
        if missing:
            fresh = np.asarray(encode(list(missing.values())), np.float32)
            if store_vecs.shape[1] not in (0, fresh.shape[1]):  # another width under this key: encode them all
                index, missing = {}, dict(zip(keys, texts, strict=True))
                fresh = np.asarray(encode(list(missing.values())), np.float32)
            self._save(path, list(missing), fresh)
        if not texts:
            return np.zeros((0, fresh.shape[1] or store_vecs.shape[1] or int(self.encoder.dim)), np.float32)
        dim = fresh.shape[1] if missing else store_vecs.shape[1]
        out = np.empty((len(texts), dim), np.float32)
        pos = {k: i for i, k in enumerate(missing)}
        for i, k in enumerate(keys):
            out[i] = fresh[pos[k]] if k in pos else store_vecs[index[k]]
        self.hits += sum(1 for k in keys if k not in pos)
        self.misses += len(missing)
        return out


def cached_query_encoder(bench: Any, meta: dict, *, device: str | None = None, query_prompt: str | None = None,
                         cache_dir: str | os.PathLike | None = None) -> CachedQueryEncoder:
    """The query encoder of a space (``meta``) behind the content-hash store of ``bench`` (module docstring)."""
    root = getattr(bench, "root", None)
    return CachedQueryEncoder(meta, cache_dir or default_cache_dir(root), device=device, query_prompt=query_prompt)
