import sys

from eval.cli_support import run_typer
from forecasters.cli import app

if __name__ == "__main__":
    sys.exit(run_typer(app))
