import sys

# No retrieval command quantizes a model, so bitsandbytes stays out of this process: peft (which transformers and
# sentence-transformers import whenever it is installed) imports it when it can, and on CPUs with AVX512-BF16
# bitsandbytes then logs "Failed to load CPU gemm_4bit_forward ..." on every text-model load. A None entry in
# sys.modules makes the import fail as if the package were absent; the 4-bit paths live in distill/ and forecasters/.
sys.modules.setdefault("bitsandbytes", None)

from eval.cli_support import run_typer  # noqa: E402
from eval.threads import prefer_passive_wait  # noqa: E402
from retrieval.cli import app  # noqa: E402

if __name__ == "__main__":
    prefer_passive_wait()  # before torch loads: idle OpenMP workers sleep instead of spinning (eval.threads)
    sys.exit(run_typer(app))
