import sys

from distill.cli import main
from eval.cli_support import run_main

if __name__ == "__main__":
    sys.exit(run_main(main))
