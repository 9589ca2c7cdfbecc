"""The PSR benchmark: format, loading, validation, the synthetic benchmark, metrics, statistics and reports.

Depends on nothing else of the toolkit. Run ``python -m eval --help`` for the commands.

The names below are imported on first use (PEP 562 ``__getattr__``): ``import eval`` (and every command line's
``--help``, which imports ``eval.cli_support``) does not pay for pyarrow, datasets and pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

#: Public name -> the module that defines it.
_LAZY = {"Benchmark": "eval.benchmark", "GTPools": "eval.schema", "Manifest": "eval.schema", "Query": "eval.schema",
         "Segment": "eval.schema", "State": "eval.schema", "TranscriptEntry": "eval.schema"}

__all__ = ["Benchmark", "GTPools", "Manifest", "Query", "Segment", "State", "TranscriptEntry"]

if TYPE_CHECKING:
    from eval.benchmark import Benchmark
    from eval.schema import GTPools, Manifest, Query, Segment, State, TranscriptEntry


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'eval' has no attribute {name!r}")
