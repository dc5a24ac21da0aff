#!/usr/bin/env bash
# mypy (strict, as over src/) over the tests, one run per directory of tests/.
#
# pytest imports a test directory's modules by their bare names (pyproject's `pythonpath`: tests/ and tests/e2e,
# and its default "prepend" import mode: the test file's own directory), so several directories hold a module
# of the same name (each its own conftest.py), which one mypy run cannot tell apart. Each run puts its directory
# on the path as pytest does, and checks that directory's files; the runs share mypy's cache.
set -euo pipefail
cd "$(dirname "$0")/.."
MYPY=${MYPY:-mypy}
status=0
for dir in $(find tests -name '*.py' -not -path '*/__pycache__/*' -printf '%h\n' | sort -u); do
  # tests/config and tests/scheduler hold modules that tests of other directories import too (the dstack
  # oracle; the scheduler's test fixtures)
  MYPYPATH="tests:tests/e2e:tests/config:tests/scheduler:$dir" "$MYPY" "$dir"/*.py || status=1
done
exit "$status"
