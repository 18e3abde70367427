#!/usr/bin/env bash
# A venv with FlashInfer's JIT and a CUDA 13 toolchain from PyPI wheels, for
# `make test-clients` (tests/clients/test_flashinfer.py). flashinfer-python would pull
# a CUDA torch: installed --no-deps, with its small deps and the CPU torch.
# Measured here: ~5 min, 2.1 GB.
set -euo pipefail
venv=${1:-.venv-flashinfer}
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import flashinfer" 2>/dev/null; then
    exit 0
fi
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" 'torch==2.13.0+cpu' numpy ninja 'apache-tvm-ffi>=0.1.11,<0.2' click einops \
    nvidia-ml-py 'packaging>=24.2' requests tabulate tqdm
"${pip[@]}" --no-deps 'flashinfer-python==0.7.2.post1' 'nvidia-cuda-nvcc==13.5.37' \
    'nvidia-cuda-runtime==13.5.37' 'nvidia-cuda-crt==13.5.37' 'nvidia-nvvm==13.5.37'
"$venv/bin/python" -c "import flashinfer; print('flashinfer', flashinfer.__version__)"
