import sys

from eval.environment import exclude_bitsandbytes

exclude_bitsandbytes()  # no retrieval command quantizes a model

from eval.cli_support import run_typer  # noqa: E402
from eval.threads import prefer_passive_wait  # noqa: E402
from retrieval.cli import app  # noqa: E402

if __name__ == "__main__":
    prefer_passive_wait()  # before torch loads: idle OpenMP workers sleep instead of spinning (eval.threads)
    sys.exit(run_typer(app))
