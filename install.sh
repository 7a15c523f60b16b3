#!/usr/bin/env bash
# Installs nanochat-tui into ./.venv. `bash install.sh` for the app, `bash install.sh test` for the
# test tools too. On a machine without CUDA it installs PyTorch's CPU build (a plain `pip install
# torch` would pull a multi-GB CUDA build); with an NVIDIA GPU it installs the default CUDA build.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "${pip[@]}" torch
  else
    "${pip[@]}" "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu --timeout 10 --retries 1 \
      || "${pip[@]}" "torch==2.13.0"
  fi
fi
if [ "${1:-}" = "test" ]; then "${pip[@]}" -e ".[test]"; else "${pip[@]}" -e .; fi
# The CPU decode kernels (model/cpu/qdecode.c) need a C compiler; without one the app
# still runs, dequantized to fp32, and this prints why.
.venv/bin/python -m model.cpu.native
# The project's own bytecode, compiled now: an editable install leaves it to the first run, and
# where PYTHONDONTWRITEBYTECODE is set every start compiled ~150 modules again (0.3-0.5 s of CPU).
.venv/bin/python -m compileall -q chatapp model kvcache >/dev/null
