"""The PSR benchmark: format, loading, validation, the synthetic benchmark, metrics, statistics and reports.

Depends on nothing else of the toolkit. Run ``python -m eval --help`` for the commands.
"""

from eval.benchmark import Benchmark
from eval.schema import GTPools, Manifest, Query, Segment, State, TranscriptEntry

__all__ = ["Benchmark", "GTPools", "Manifest", "Query", "Segment", "State", "TranscriptEntry"]
