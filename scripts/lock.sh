#!/usr/bin/env bash
# Updates the lock: uv.lock (one universal resolution for CPython 3.10-3.13 on Linux x86-64 and arm64, the
# environments in pyproject.toml's [tool.uv]) and its two exports with hashes, which scripts/bootstrap.sh
# installs with pip --require-hashes:
#   requirements/runtime.txt   corral's dependencies and the build backend (scripts/demo.sh)
#   requirements/dev.txt       the same plus the dev extra and the lock tool (scripts/test.sh, CI)
# Then checks that every locked package has a wheel for each of the eight supported targets.
#
#   scripts/lock.sh                    re-resolve after a change to pyproject.toml, moving nothing else
#   scripts/lock.sh --upgrade          every package to the newest release the ranges allow
#   scripts/lock.sh --upgrade-package NAME [--upgrade-package NAME ...]
#
# Run scripts/test.sh --fresh first: it tries the newest releases before they land in the lock.
# The lock tool (uv) is itself pinned in the lock's `lock` group; a first run without a dev venv installs
# that pin into a throwaway one.
set -euo pipefail
cd "$(dirname "$0")/.."
uv_pin=$(sed -n 's/^lock = \["uv==\([0-9.]*\)"\].*/\1/p' pyproject.toml)
[ -n "$uv_pin" ] || { echo "pyproject.toml's [dependency-groups] lock names no uv==VERSION" >&2; exit 1; }
UV=.venv/bin/uv
if [ ! -x "$UV" ] || [ "$("$UV" --version | cut -d' ' -f2)" != "$uv_pin" ]; then
  tooldir=$(mktemp -d); trap 'rm -rf "$tooldir"' EXIT
  echo "== uv $uv_pin into a throwaway venv"
  "${PYTHON:-python3}" -m venv "$tooldir/venv"
  "$tooldir/venv/bin/python" -m pip install -q "uv==$uv_pin" 2>&1 | grep -v "^WARNING: Location" || true
  UV="$tooldir/venv/bin/uv"
fi
echo "== uv lock $*"
"$UV" lock "$@"
echo "== export requirements/runtime.txt and requirements/dev.txt"
"$UV" export -q --frozen --no-emit-project --group build -o requirements/runtime.txt
"$UV" export -q --frozen --no-emit-project --extra dev --group build --group lock -o requirements/dev.txt
echo "== a wheel for every target (no source builds on any supported platform)"
for py in 3.10 3.11 3.12 3.13; do
  for plat in x86_64-manylinux_2_28 aarch64-manylinux_2_28; do
    out=$("$UV" pip install -q --dry-run --target "$(mktemp -d)" --python-version "$py" --python-platform "$plat" \
          --only-binary :all: --require-hashes --no-deps -r requirements/dev.txt 2>&1) \
      || { echo "CPython $py on $plat: $out" >&2; exit 1; }
    echo "CPython $py on $plat: ok"
  done
done
git --no-pager diff --stat -- uv.lock requirements/ 2>/dev/null || true
