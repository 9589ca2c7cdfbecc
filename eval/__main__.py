import sys

from eval.cli import app
from eval.cli_support import run_typer

if __name__ == "__main__":
    sys.exit(run_typer(app))
