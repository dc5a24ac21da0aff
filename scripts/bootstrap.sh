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
# ssh-keygen (users' SSH keys) and git (repos: the CLI computes diffs, agents clone) when missing
missing=""
command -v ssh-keygen >/dev/null 2>&1 || missing="$missing openssh-client"
command -v git >/dev/null 2>&1 || missing="$missing git"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== apt-get install$missing"
    # shellcheck disable=SC2086
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing) >/dev/null
  else
    echo "Missing:$missing (install them, e.g. with apt-get as root)" >&2
  fi
fi
