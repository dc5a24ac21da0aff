#!/usr/bin/env bash
# Shared by demo.sh and test.sh: a virtualenv in .venv with corral (and, with --dev, its test tools).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
extra=""
if [ "${1:-}" = "--dev" ]; then extra="[dev]"; fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e ".${extra}" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import corral" || { echo "corral failed to install" >&2; exit 1; }
if ! command -v ssh-keygen >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq openssh-client) >/dev/null
fi
