#!/usr/bin/env bash
# The wheels a bare CUDA Python (torch, transformers, accelerate, peft already there) lacks for benchmarks/gpu_check.py,
# for CPython 3.12 on x86-64 Linux, into .whl/ (git-ignored), plus GeoPilot itself as a wheel. docs/gpu.md says how
# they are installed there. PYTHON_VERSION=3.11 ./benchmarks/gpu_wheels.sh for another interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON_VERSION:-3.12}
rm -rf .whl && mkdir -p .whl
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# Pinned as constraints.txt pins them; the rest of what they need is on the device already (its pip list).
wheels=(transformers==5.24.0 huggingface-hub==2.4.0 tokenizers==0.23.3 pydantic==2.14.4 pydantic-core==2.50.5
  annotated-types==0.7.0 typing-inspection==0.4.2 open_clip_torch==3.3.0 ftfy==6.3.1 wcwidth==0.2.13
  pycocotools==2.0.11 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 python-multipart==0.0.34)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp "${platforms[@]}" \
  -d .whl "${wheels[@]}"
python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl .
du -sh .whl
