#!/bin/sh
# scripts/gpu_check.py on a GPU machine, from the wheels scripts/gpu_check_wheels.sh built (docs/dev/gpu-check.md).
# corral goes into a directory of its own (pip --target) on PYTHONPATH, not into a virtualenv: the image's python3
# may itself be a virtualenv whose torch a venv made from it would not see. Nothing else is installed or changed.
#
#   scripts/gpu_check.sh WHEELS_DIR OUT_DIR [gpu_check.py options]      (PYTHON: python3 unless set)
set -eu
wheels=${1:?usage: scripts/gpu_check.sh WHEELS_DIR OUT_DIR [gpu_check.py options]}
out=${2:?usage: scripts/gpu_check.sh WHEELS_DIR OUT_DIR [gpu_check.py options]}
shift 2
py=${PYTHON:-python3}
# the GPU task runs the python3 on PATH: the one the check runs, when PYTHON names one by its path
case $py in */*) PATH="$(cd "$(dirname "$py")" && pwd):$PATH"; export PATH ;; esac
here=$(cd "$(dirname "$0")" && pwd)
site=$(mktemp -d "${TMPDIR:-/tmp}/corral-gpu-check-site.XXXXXX")
trap 'rm -rf "$site"' EXIT
"$py" -m pip install --quiet --no-index --no-deps --disable-pip-version-check --target "$site" "$wheels"/*.whl
# the whole check ends within 5 minutes (its runs within --budget, 270 s by default)
# (past 300 s, SIGTERM: it stops its server and agents before it exits; SIGKILL 20 s later if it has not)
PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" timeout --kill-after=20 300 "$py" "$here/gpu_check.py" "$out" "$@"
