"""Canonicalization probes (PSR appendix: "State extraction and canonicalization", the paraphrase oracle, the
cross-model description) and the paraphrase-robust reads.

Modules: `cluster` (the greedy rule, exact and fast, and the reference loop), `vocab` (the raw state vocabulary and
the phrase-file formats), `metrics` (vocabulary statistics, purity / inverse purity / ARI), `sweep` (the threshold
sweep), `store` (one saved clustering), `assign` (new phrases and phrase files against a saved clustering), `apply`
(re-keying a benchmark), `snap` (canonicalize-then-retrieve), `finetune` (the paraphrase-robust encoder), `report`
(the decomposition table and the robust reads), `speed` (the clustering speed benchmark), `cli` (``python -m
retrieval canon``).
"""
