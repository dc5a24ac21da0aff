#!/usr/bin/env bash
# Shared by demo.sh and test.sh: a virtualenv in .venv with corral (and, with --dev, its test tools),
# installed from the lock (requirements/runtime.txt or requirements/dev.txt, exported from uv.lock by
# scripts/lock.sh) with every file's hash checked by pip. corral itself then installs with --no-deps and
# the locked build backend (--no-build-isolation), so nothing unlocked is fetched.
#
# The lock covers CPython 3.10-3.13 on Linux x86-64 and arm64. Elsewhere the script says so and installs
# from the ranges in pyproject.toml (what `pip install corral` gets).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
lock=requirements/runtime.txt
extra=""
if [ "${1:-}" = "--dev" ]; then lock=requirements/dev.txt; extra="[dev]"; fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# pip's own notices about this machine's extra wheel folders are noise here.
quiet_pip() { grep -v -E "^WARNING: (Location|The directory)" || true; }

supported=$(.venv/bin/python - <<'PY'
import platform, sys
print(int(sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")
          and (3, 10) <= sys.version_info[:2] <= (3, 13) and platform.python_implementation() == "CPython"))
PY
)
# A stamp per lock: the lock's and pyproject.toml's hash when it was last installed here. The dev lock holds every
# runtime pin (both are exported from the one uv.lock), so installing it stamps both.
stamp() { echo ".venv/.corral-lock-$(basename "$1" .txt)"; }
want="$(sha256sum "$lock" pyproject.toml | sha256sum | cut -c1-64)"
if [ "$supported" = 1 ]; then
  if [ "$(cat "$(stamp "$lock")" 2>/dev/null)" != "$want" ]; then
    echo "== installing from $lock (hashes checked)"
    .venv/bin/python -m pip install -q --require-hashes --no-deps -r "$lock" 2>&1 | quiet_pip
    .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | quiet_pip
    .venv/bin/python -m pip check >/dev/null || { .venv/bin/python -m pip check >&2; exit 1; }
    echo "$want" >"$(stamp "$lock")"
    if [ "$lock" = requirements/dev.txt ]; then
      sha256sum requirements/runtime.txt pyproject.toml | sha256sum | cut -c1-64 >"$(stamp requirements/runtime.txt)"
    fi
  fi
else
  echo "== no lock for $(.venv/bin/python -c 'import platform,sys; print(platform.python_implementation(), sys.version.split()[0], sys.platform, platform.machine())'):" \
       "installing from the ranges in pyproject.toml (the lock covers CPython 3.10-3.13 on Linux x86-64 and arm64)" >&2
  rm -f .venv/.corral-lock-*
  .venv/bin/python -m pip install -q -e ".${extra}" 2>&1 | quiet_pip
fi
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
