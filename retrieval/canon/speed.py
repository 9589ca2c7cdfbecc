r"""Speed benchmark of the greedy clustering (`retrieval.canon.cluster`) on synthetic clustered embeddings.

Data (`clustered_embeddings`): ``n_clusters`` centres uniform on the unit sphere of ``R^d``; cluster sizes
``1 + Poisson(n / n_clusters - 1)`` trimmed to ``n`` rows in all; a member is ``normalise(c + sigma g / sqrt(d))``
with ``g ~ N(0, I_d)`` and a per-cluster spread ``sigma ~ U(sigma_lo, sigma_hi)``, so two members of one cluster
have cosine about ``1 / (1 + sigma^2)`` (0.94 .. 0.85 by default: most clusters merge at 0.85, the loosest split).
Phrase frequencies are Zipf-like (``count = floor(1e4 / rank^0.8)`` over a random permutation), visited most
frequent first, as in the PSR pipeline (51,362 canonical states from the raw vocabulary).

Timed in one run, same data, same threads:

- ``fast``: `greedy_cluster` (blocked int8 or float32 screen against the growing seed set + exact refinement);
- ``(a) loop``: `greedy_cluster_loop` with float32 matrix-vector products (the fastest straightforward loop), run
  on ``loop_phrases`` phrases in slices spread over the visiting order (each slice starts from the true seed set
  at its position) and extrapolated: its per-phrase time is modelled as ``c0 + c1 S`` (``S`` = seeds at that
  moment), fitted by least squares on the slices, and summed over the real seed-count curve of the fast run;
- ``(b) dense``: one product of all phrases against the final seed set, in the same tiles, with the row maximum
  (the natural bound of the work: every phrase meets at most every final seed), in float32 (BLAS; the target is
  stated against it) and in int8 (the arithmetic of the default screen; reported beside it).

The three are timed in interleaved rounds (``rounds``, default 2) and each keeps its fastest round; the 1-minute load
average of every round is recorded: on a shared machine every timing is noisy.

Targets of the issue: ``fast`` at least 20x faster than ``(a)`` and within 2x of ``(b)``.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass

import numpy as np

from eval.errors import InputError
from retrieval.canon.cluster import DEFAULT_BLOCK, DEFAULT_SEED_CHUNK, greedy_cluster, greedy_cluster_loop, unit_rows


@dataclass
class SpeedConfig:
    """Benchmark settings (written next to the results)."""

    n: int = 200_000
    n_clusters: int = 50_000
    dim: int = 384
    threshold: float = 0.85
    sigma_lo: float = 0.25
    sigma_hi: float = 0.42
    loop_phrases: int = 6000
    block: int = DEFAULT_BLOCK
    seed_chunk: int = DEFAULT_SEED_CHUNK
    seed: int = 0
    screen: str = "int8"
    rounds: int = 2
    check_exact: int = 0  # > 0: also compare the fast labels with the exact loop on this many phrases


def clustered_embeddings(n: int, n_clusters: int, dim: int, *, sigma_lo: float = 0.25, sigma_hi: float = 0.42,
                         seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(emb (n, dim) float32 L2-normalised, true cluster (n,) int64, counts (n,) int64)``; see the module docstring."""
    if not 1 <= n_clusters <= n:
        raise InputError(f"need 1 <= n_clusters <= n, got {n_clusters} clusters for {n} rows")
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    sizes = 1 + rng.poisson(n / n_clusters - 1, n_clusters)
    truth = np.repeat(np.arange(n_clusters), sizes)[:n]
    if len(truth) < n:
        truth = np.concatenate([truth, rng.integers(0, n_clusters, n - len(truth))])
    truth = truth[rng.permutation(n)]
    sigma = rng.uniform(sigma_lo, sigma_hi, n_clusters).astype(np.float32)
    emb = np.empty((n, dim), np.float32)
    for s in range(0, n, 65536):  # chunks bound the temporary noise matrix
        t = truth[s:s + 65536]
        x = centres[t] + sigma[t, None] * rng.standard_normal((len(t), dim), dtype=np.float32) / np.float32(np.sqrt(dim))
        emb[s:s + 65536] = x / np.linalg.norm(x, axis=1, keepdims=True)
    counts = np.floor(1e4 / (1 + rng.permutation(n)) ** 0.8).astype(np.int64) + 1
    return emb, truth.astype(np.int64), counts


def _seed_curve(clustering, n: int) -> np.ndarray:
    """``(n,)`` number of seeds that exist when each visiting position is reached."""
    founded = np.zeros(n, np.int64)
    founded[_positions(clustering.order, clustering.seeds)] = 1
    return np.concatenate([[0], np.cumsum(founded)[:-1]])


def _positions(order: np.ndarray, rows: np.ndarray) -> np.ndarray:
    pos = np.empty(len(order), np.int64)
    pos[order] = np.arange(len(order))
    return pos[rows]


def time_loop(units: np.ndarray, clustering, threshold: float, total: int, slices: int = 5) -> list[tuple[int, float]]:
    """Time the float32 loop (`greedy_cluster_loop`) on ``slices`` slices of ``total // slices`` phrases spread over
    the visiting order, each started from the true seed set at its start (from ``clustering``, which the loop
    reproduces). Returns ``[(seeds at the slice start, seconds per phrase)]``."""
    n = len(clustering.order)
    m = max(1, total // slices)
    curve = _seed_curve(clustering, n)
    seed_pos = np.sort(_positions(clustering.order, clustering.seeds))
    seeds_by_pos = clustering.order[seed_pos]  # seed rows in seed order
    points = []
    for start in np.linspace(0, max(n - m, 0), slices).astype(int):
        init = seeds_by_pos[: curve[start]]
        rows = np.concatenate([init, clustering.order[start:start + m]])  # the slice as its own small problem
        sub = units[rows]
        t0 = time.perf_counter()
        greedy_cluster_loop(sub, threshold, exact=False, start=len(init), initial_seeds=np.arange(len(init)))
        points.append((int(curve[start]), (time.perf_counter() - t0) / m))
    return points


def dense_bound(units: np.ndarray, seed_rows: np.ndarray, block: int = DEFAULT_BLOCK,
                seed_chunk: int = DEFAULT_SEED_CHUNK, kind: str = "float32") -> float:
    """Seconds of one product of all phrases against the final seeds, in the same tiles as the fast path, with the
    running row maximum: nothing but the product and one reduction. ``kind``: ``"float32"`` (BLAS) or ``"int8"``
    (the int8 codes of the fast path's default screen, exact int32 products)."""
    import torch

    if kind == "int8":
        scale = float(np.abs(units).max()) / 127.0
        units = np.rint(units / scale).astype(np.int8)
    seeds = np.ascontiguousarray(units[seed_rows])
    best = np.full(units.shape[0], np.iinfo(np.int32).min if kind == "int8" else -2.0,
                   np.int32 if kind == "int8" else np.float32)
    buf = np.empty((block, min(seed_chunk, len(seeds))), np.float32)
    t0 = time.perf_counter()
    for a in range(0, units.shape[0], block):
        blk = units[a:a + block]
        tb = torch.from_numpy(blk) if kind == "int8" else None
        for s in range(0, len(seeds), seed_chunk):
            t = seeds[s:s + seed_chunk]
            if kind == "int8":
                tile = torch._int_mm(tb, torch.from_numpy(t).T).numpy()
            else:
                tile = np.matmul(blk, t.T, out=buf[: len(blk), : len(t)])
            np.maximum(best[a:a + block], tile.max(axis=1), out=best[a:a + block])
    return time.perf_counter() - t0


def _blas() -> str:
    cfg = np.show_config(mode="dicts") or {}
    blas = cfg.get("Build Dependencies", {}).get("blas", {})
    return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()


def _fit_loop(points: list[tuple[int, float]], s_curve: np.ndarray) -> tuple[float, float, float]:
    """Least-squares ``c0 + c1 S`` (clipped at 0) over timed slices, summed over the seed-count curve:
    ``(c0, c1, extrapolated seconds)``."""
    xs = np.array([p[0] for p in points], np.float64)
    ys = np.array([p[1] for p in points], np.float64)
    (c0, c1), *_ = np.linalg.lstsq(np.stack([np.ones_like(xs), xs], 1), ys, rcond=None)
    c0, c1 = max(float(c0), 0.0), max(float(c1), 0.0)
    return c0, c1, float(c0 * len(s_curve) + c1 * s_curve.sum())


def run_speed_benchmark(cfg: SpeedConfig, *, progress: bool = True, log=print) -> dict:
    """Run the timings of the module docstring in ``cfg.rounds`` interleaved rounds (fast, (b) float32, (b') int8,
    (a) slices, then again), keeping each method's fastest round: on a shared machine the load changes within minutes,
    and the minimum over rounds is the closest to each method's own cost. Returns a JSON-able dict."""
    from retrieval.canon.cluster import visit_order
    from retrieval.canon.metrics import partition_scores

    t0 = time.perf_counter()
    emb, truth, counts = clustered_embeddings(cfg.n, cfg.n_clusters, cfg.dim, sigma_lo=cfg.sigma_lo,
                                              sigma_hi=cfg.sigma_hi, seed=cfg.seed)
    order = visit_order(counts)
    log(f"data: {cfg.n:,} x {cfg.dim} with {cfg.n_clusters:,} true clusters ({time.perf_counter() - t0:.1f} s)")
    greedy_cluster(emb[:2000], cfg.threshold, screen=cfg.screen)  # compile the numba pass outside the timing
    units = unit_rows(emb)
    m = min(cfg.loop_phrases, cfg.n)
    rounds: list[dict] = []
    fast = None
    for r in range(cfg.rounds):
        t0 = time.perf_counter()
        fast = greedy_cluster(emb, cfg.threshold, order, block=cfg.block, seed_chunk=cfg.seed_chunk,
                              screen=cfg.screen, progress=progress)
        rd = {"fast_s": time.perf_counter() - t0, "load_avg_1m": os.getloadavg()[0]}
        rd["dense_bound_s"] = dense_bound(units, fast.seeds, cfg.block, cfg.seed_chunk)
        rd["dense_bound_int8_s"] = dense_bound(units, fast.seeds, cfg.block, cfg.seed_chunk, kind="int8")
        rd["loop_points"] = time_loop(units, fast, cfg.threshold, m)
        rounds.append(rd)
        log(f"round {r + 1}: fast {rd['fast_s']:.1f} s; (b) dense {rd['dense_bound_s']:.1f} s float32, "
            f"{rd['dense_bound_int8_s']:.1f} s int8; (a) {sum(p[1] for p in rd['loop_points']) * 1e3 / len(rd['loop_points']):.1f}"
            f" ms/phrase over the slices (load {rd['load_avg_1m']:.1f})")
    s_curve = _seed_curve(fast, cfg.n)
    best = {k: min(rd[k] for rd in rounds) for k in ("fast_s", "dense_bound_s", "dense_bound_int8_s")}
    points = [(rounds[0]["loop_points"][i][0], min(rd["loop_points"][i][1] for rd in rounds))
              for i in range(len(rounds[0]["loop_points"]))]
    c0, c1, t_loop = _fit_loop(points, s_curve)
    t_fast = best["fast_s"]
    log(f"(a) loop model {c0 * 1e6:.1f} us + {c1 * 1e9:.2f} ns/seed -> {t_loop:.0f} s extrapolated")
    out = {
        "config": asdict(cfg), "screen": cfg.screen,
        **best, "loop_extrapolated_s": t_loop, "loop_subset_phrases": m,
        "loop_subset_s": sum(p[1] for p in points) * (m // len(points)),
        "loop_model": {"c0_s": c0, "c1_s_per_seed": c1, "points": points},
        "speedup_vs_loop": t_loop / t_fast, "ratio_to_dense_bound": t_fast / best["dense_bound_s"],
        "ratio_to_dense_bound_int8": t_fast / best["dense_bound_int8_s"],
        "rounds": rounds, "clusters": fast.n_clusters, "mean_seeds_seen": float(s_curve.mean()),
        "quality": partition_scores(fast.labels, truth),
        "targets": {"speedup_vs_loop_min": 20.0, "ratio_to_dense_bound_max": 2.0},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor(),
                    "numpy": np.__version__, "blas": _blas(), "load_avg_1m": os.getloadavg()[0]},
    }
    out["targets_met"] = bool(out["speedup_vs_loop"] >= 20.0 and out["ratio_to_dense_bound"] <= 2.0)
    if cfg.check_exact:
        k = min(cfg.check_exact, cfg.n)
        sub = order[:k]
        ref = greedy_cluster_loop(emb[sub], cfg.threshold)
        fast_sub = greedy_cluster(emb[sub], cfg.threshold, screen=cfg.screen)
        out["exact_check"] = {"phrases": k, "equal": bool(np.array_equal(ref.labels, fast_sub.labels))}
    return out
