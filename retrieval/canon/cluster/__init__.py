"""Greedy embedding clustering of raw state phrases: the PSR canonicalization rule, exact and fast.

===================================  ============================================================================
`retrieval.canon.cluster.rule`       the rule, `Clustering`, `visit_order`, the reference loop `greedy_cluster_loop`
`retrieval.canon.cluster.similarity` ``sim``: float32 unit rows (`unit_rows`), exact dot products (`exact_dots`)
`retrieval.canon.cluster.fast`       the fast path: `greedy_cluster`, `extend_clustering`, `assign`, `similar_pairs`
`retrieval.canon.cluster.steps`      its steps on one block: screen, refine, resolve, assign
`retrieval.canon.cluster.screen`     the screen interface (`Screen`) and its int8 / float32 implementations
===================================  ============================================================================
"""

from retrieval.canon.cluster.fast import (
    DEFAULT_BLOCK,
    DEFAULT_SEED_CHUNK,
    Extension,
    assign,
    extend_clustering,
    greedy_cluster,
    similar_pairs,
)
from retrieval.canon.cluster.rule import TIES, Clustering, greedy_cluster_loop, visit_order
from retrieval.canon.cluster.screen import (
    SCREENS,
    Screen,
    int8_screen_available,
    make_screen,
    resolve_screen,
    screen_margin,
)
from retrieval.canon.cluster.similarity import UNIT_TOL, check_threshold, exact_dots, unit_rows

__all__ = [
    "DEFAULT_BLOCK", "DEFAULT_SEED_CHUNK", "SCREENS", "TIES", "UNIT_TOL", "Clustering", "Extension", "Screen", "assign",
    "check_threshold", "exact_dots", "extend_clustering", "greedy_cluster", "greedy_cluster_loop",
    "int8_screen_available", "make_screen", "resolve_screen", "screen_margin", "similar_pairs", "unit_rows",
    "visit_order",
]
