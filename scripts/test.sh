#!/usr/bin/env bash
# The whole test suite: lint, types, import rules, the dstack YAML corpus, and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --dev
export PATH="$PWD/.venv/bin:$PATH"
SHARED=${CORRAL_SHARED_DIR:-../shared}

echo "== ruff";          ruff check src tests benchmarks scripts
echo "== mypy";          mypy
echo "== import rules";  lint-imports --no-cache >/dev/null && echo "all contracts kept"
echo "== YAML corpus (configuration models)"
python scripts/check_yaml_corpus.py --reference-dir "$SHARED/reference"
echo "== YAML corpus (plan endpoints of a running server)"
python scripts/corpus_against_server.py --reference-dir "$SHARED/reference"
echo "== pytest"
python -m pytest -q "$@"
