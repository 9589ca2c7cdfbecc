"""Streaming full-corpus scoring: score sources, the tile scorer `score_stream`, and `score_benchmark`.

A *score source* gives the score of query ``i`` against corpus row ``j`` on demand, in blocks; nothing here ever
holds an ``n_queries x n_corpus`` matrix. `score_stream` walks (query block x corpus chunk) tiles once and keeps,
per query:

- the top-k corpus rows of the ranking (own-video rows removed; ties broken by corpus row, ascending), and the
  number of *unlisted* items tied with the k-th score;
- per GT pool ``p`` the rank statistics that tie-aware metrics need (see `eval.metrics`), counted over the whole
  corpus, never read from the top-k list, so nothing is capped at k:

  ===============  ===========================================================================================
  ``n_pos``        pool size (positives that take part in the ranking of ``p``)
  ``n_above``      negatives scoring strictly above the best positive ``t = max_{j in P} s_j``
  ``n_tie_neg``    negatives with score exactly ``t``
  ``n_tie_pos``    positives with score exactly ``t`` (>= 1 when ``n_pos > 0``)
  ``n_tie_neg_first``  tied negatives whose corpus row is below the lowest tied positive's row (row tie-break)
  ``best``         ``t`` (float32, NaN when the pool is empty)
  ===============  ===========================================================================================

- for the tie-aware nDCG: every positive (of any pool, in the main ranking) scoring at least the k-th score, with
  its pool-membership bitmask, the number of ranked items strictly above it and the size of its tie group; and
  per query the counts of positives by bitmask (`RankedPositives`).

Exact ties. Positives' scores are gathered from the very tiles in which the negatives are counted, so a positive
and a negative with bitwise-equal scores are always recognised as tied. Each query block first scores the union of
its positive rows in one call ("pass A") to fix the thresholds (best positive per pool); the stream then counts
against them in one fused pass per tile (`eval.scoring._tile`). If a positive's tile score differs from its pass-A
score in any bit (a BLAS path that rounds differently), the block is streamed again with the thresholds taken from
the tiles, so counts always refer to one consistent set of scores (`eval.scoring.block`). State-space sources (`DenseSource` with
``item_rows``) compute each query block once at the state level and gather, so segments sharing a state receive
bitwise identical scores in every call.

Protocol (PSR paper §3.1, App. M): the query's own-video segments (``exclude``) are removed from the ranking of
every cross-instance pool and from the top-k list; pools named in ``no_exclude_pools`` (the ``in_video`` tier)
are ranked over the full corpus.

Modules:

===============================  ==================================================================================
`eval.scoring.sources`           `ScoreSource` (the base class), `DenseSource`, `RandomSource`
`eval.scoring.fusion`            `FusionSource`: z-score fusion, each input's corpus scored once per query block
`eval.scoring.streaming`         `score_stream`, `StreamResult`
`eval.scoring.block`             one query block: `BlockContext` -> pass A, tiles, pool statistics -> `BlockResult`
`eval.scoring._tile`             the fused numba tile kernel (rank counting + running top-k + own-video exclusion)
`eval.scoring.checkpoint`        finished query blocks on disk (resuming)
`eval.scoring.benchmark`         `score_benchmark`, `benchmark_groups` (a benchmark's pools, exclusions, probes)
===============================  ==================================================================================
"""

from eval.scoring.benchmark import (
    BENCHMARK_POOLS,
    BENCHMARK_TIERS,
    TRIPLET_PROBES,
    BenchmarkGroups,
    benchmark_groups,
    expected_pool_sizes,
    gt_definitions_present,
    score_benchmark,
)
from eval.scoring.block import PASS_A_QUERIES, PROBE_STAT_FIELDS, STAT_FIELDS
from eval.scoring.fusion import FusionSource
from eval.scoring.sources import (
    DEFAULT_C_CHUNK,
    DEFAULT_Q_BLOCK,
    SPREAD_RTOL,
    DenseSource,
    RandomSource,
    ScoreSource,
    as_score_source,
    source_name,
    stream_moments,
)
from eval.scoring.streaming import StreamResult, score_stream

__all__ = [
    "BENCHMARK_POOLS", "BENCHMARK_TIERS", "DEFAULT_C_CHUNK", "DEFAULT_Q_BLOCK", "PASS_A_QUERIES", "PROBE_STAT_FIELDS",
    "SPREAD_RTOL", "STAT_FIELDS", "TRIPLET_PROBES", "BenchmarkGroups", "DenseSource", "FusionSource", "RandomSource",
    "ScoreSource", "StreamResult", "as_score_source", "benchmark_groups", "expected_pool_sizes",
    "gt_definitions_present", "score_benchmark", "score_stream", "source_name", "stream_moments",
]
