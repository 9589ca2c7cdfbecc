"""The paper's Table 3 (fair MLLM comparison): a launcher of ``python -m eval compare`` (eval/compare.py).

    python scripts/compare_predictors.py --data DIR --out OUT --phrases m3=runs/m3.jsonl --text-space bge ...
    python scripts/compare_predictors.py --synthetic --data data/psr-synth --out reports/compare   # CPU plumbing

Every option is the command's: ``python -m eval compare --help``.
"""

from __future__ import annotations

import sys

from eval.cli import app
from eval.cli_support import run_typer

if __name__ == "__main__":
    sys.exit(run_typer(app, ["compare", *sys.argv[1:]], prog_name="python -m eval"))
