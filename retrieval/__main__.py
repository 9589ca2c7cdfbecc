import sys

from eval.cli_support import run_typer
from eval.threads import prefer_passive_wait
from retrieval.cli import app

if __name__ == "__main__":
    prefer_passive_wait()  # before torch loads: idle OpenMP workers sleep instead of spinning (eval.threads)
    sys.exit(run_typer(app))
