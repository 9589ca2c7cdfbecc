"""The paper's Table 3 (fair MLLM comparison): a launcher of ``python -m eval compare`` (eval/compare.py).

    python scripts/compare_predictors.py --data DIR --out OUT --phrases m3=runs/m3.jsonl --text-space bge ...
    python scripts/compare_predictors.py --synthetic --data data/psr-synth --out reports/compare   # CPU plumbing

Every option is the command's: ``python -m eval compare --help``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: this checkout's packages, not another checkout's editable install
    sys.path.insert(0, str(ROOT))

from eval.cli import app  # noqa: E402
from eval.cli_support import run_typer  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_typer(app, ["compare", *sys.argv[1:]], prog_name="python -m eval"))
