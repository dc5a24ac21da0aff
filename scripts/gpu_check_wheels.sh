#!/bin/sh
# The wheels to carry to a GPU machine for scripts/gpu_check.py (docs/dev/gpu-check.md): corral itself and its
# locked runtime dependencies (requirements/runtime.txt, hashes checked), binary wheels only, for CPython 3.12
# on x86-64 Linux, whatever Python and machine build them. There they install with
#   python3 -m pip install --no-index --no-deps --target DIR WHEELS/*.whl   and run with PYTHONPATH=DIR.
#
#   scripts/gpu_check_wheels.sh OUT_DIR [PYTHON_VERSION]      (PYTHON_VERSION: 3.12 unless given)
set -eu
out=${1:?usage: scripts/gpu_check_wheels.sh OUT_DIR [PYTHON_VERSION]}
version=${2:-3.12}
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
# manylinux wheels of any glibc a current image has, and pure-Python ones; never an sdist to build there
"$py" -m pip download --quiet --only-binary :all: --no-deps --require-hashes \
    --implementation cp --python-version "$version" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -r requirements/runtime.txt -d "$out"
"$py" -m pip wheel --quiet --no-deps --no-build-isolation . -w "$out"
ls "$out"/corral-*.whl >/dev/null
echo "$(ls "$out"/*.whl | wc -l) wheels in $out"
