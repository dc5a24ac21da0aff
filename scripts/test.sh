#!/usr/bin/env bash
# The whole test suite: lint, types, import rules, the agent and the gateway on Python 3.9 (vermin), the user guide (mkdocs),
# the dstack YAML corpus, and pytest (which lists every skip and fails on any that is not a platform condition).
#
#   scripts/test.sh            the whole suite, from the lock (what CI runs)
#   scripts/test.sh --fresh    tomorrow's releases: see fresh() below (not part of CI)
#   scripts/test.sh ARGS...    the whole suite, with ARGS passed to pytest
set -euo pipefail
cd "$(dirname "$0")/.."

# The newest releases that pyproject.toml's ranges allow, in a throwaway venv, through the fast part of the suite:
# ruff, mypy, the import rules, the pure and unit tests and the server-process tests. Every step runs and says
# pass or FAIL; the packages that moved past the lock are listed first. Run it before scripts/lock.sh --upgrade.
fresh() {
  local venv status=0
  venv=$(mktemp -d)/venv
  echo "== a throwaway venv with the newest releases the ranges allow ($venv)"
  "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip setuptools wheel 2>&1 | grep -v "^WARNING: Location" || true
  "$venv/bin/python" -m pip install -q --upgrade --upgrade-strategy eager -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
  echo "== packages past the lock (requirements/dev.txt -> fresh)"
  "$venv/bin/python" scripts/fresh_check.py requirements/dev.txt
  step() {
    local name=$1; shift
    if (export PATH="$venv/bin:$PATH"; "$@") >"$venv/../$name.log" 2>&1; then
      echo "pass  $name"
    else
      echo "FAIL  $name (its output: $venv/../$name.log)"; tail -n 15 "$venv/../$name.log" | sed 's/^/      /'; status=1
    fi
  }
  step ruff ruff check src tests benchmarks scripts
  step mypy mypy
  step mypy-tests scripts/mypy_tests.sh
  step import-rules lint-imports --no-cache
  step unit-tests python -m pytest -q -p no:cacheprovider tests/domain tests/scheduler tests/config tests/sdk \
    tests/cli tests/store tests/test_known_warnings.py
  step server-process python -m pytest -q -p no:cacheprovider tests/e2e/test_server_process.py tests/test_server_startup.py
  [ "$status" = 0 ] && echo "== fresh: every step passed" || echo "== fresh: some steps FAILED (see above)"
  return "$status"
}
if [ "${1:-}" = "--fresh" ]; then
  shift
  fresh
  exit $?
fi

# Debian packages the tests use, installed only when missing (CI runs this as root on a fresh machine).
# SSH fleet tests: sshd for the fake hosts; iproute2 (netns, veth, bridge) and util-linux (unshare).
install_test_packages() {
  local missing=()
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  # SSH into jobs (tests/e2e/test_official_dstack_client_attach.py): OpenSSH's client, scp and sftp, and
  # the sftp-server the agent runs in a job for sftp and plain scp.
  command -v ssh-keygen >/dev/null && command -v scp >/dev/null && command -v sftp >/dev/null || missing+=(openssh-client)
  [ -x /usr/lib/openssh/sftp-server ] || missing+=(openssh-sftp-server)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v unshare >/dev/null || missing+=(util-linux)
  # The job sandbox: NAT for jobs' outbound traffic (setpriv, for the non-root fallback, is util-linux).
  command -v iptables-restore >/dev/null || missing+=(iptables)
  # Container tests: Docker's engine and CLI, a private registry, a static busybox to import as images.
  [ -x /usr/sbin/dockerd ] && command -v docker >/dev/null || missing+=(docker.io)
  command -v docker-registry >/dev/null || missing+=(docker-registry)
  dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "ok installed" || missing+=(busybox-static)
  # Postgres tests (tests/pg_harness.py): a throwaway cluster from initdb + pg_ctl.
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null || missing+=(postgresql)
  # The ACME tests (tests/pebble_harness.py): pebble, a private ACME CA, and pebble-challtestsrv as its DNS server
  # (the Debian package ships both).
  command -v pebble >/dev/null && command -v pebble-challtestsrv >/dev/null || missing+=(pebble)
  # The web UI's browser tests (tests/ui/test_ui_browser.py): Debian's chromium, driven by Playwright;
  # npm fetches axe-core for the accessibility audit (cached under ~/.cache/corral-tests).
  command -v chromium >/dev/null || missing+=(chromium)
  command -v npm >/dev/null || missing+=(npm)
  # The Slurm backend's test cluster (tests/slurm_harness.py): Debian's Slurm daemons, its client and munge,
  # without their recommends (installed on their own below).
  local slurm=()
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sinfo >/dev/null \
    && command -v munged >/dev/null || slurm+=(slurmctld slurmd slurm-client munge)
  [ $((${#missing[@]} + ${#slurm[@]})) -gt 0 ] || return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq >/dev/null
    if [ ${#missing[@]} -gt 0 ]; then
      echo "== apt-get install ${missing[*]}"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    if [ ${#slurm[@]} -gt 0 ]; then
      echo "== apt-get install --no-install-recommends ${slurm[*]}"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${slurm[@]}" >/dev/null
    fi
  else
    echo "== missing: ${missing[*]} ${slurm[*]} (not root or no apt-get: the tests that need them will fail saying so)"
  fi
}
install_test_packages
scripts/bootstrap.sh --dev
export PATH="$PWD/.venv/bin:$PATH"

# The lock's exports are what uv.lock says (a hand edit of requirements/*.txt, or a forgotten export, fails here).
same_export() { diff -q <(uv export -q --frozen --no-emit-project "${@:2}" | grep -v "^#") <(grep -v "^#" "$1") >/dev/null; }
echo "== lock";          uv lock --check --offline -q \
  || { echo "uv.lock does not match pyproject.toml: run scripts/lock.sh" >&2; exit 1; }
same_export requirements/runtime.txt --group build \
  && same_export requirements/dev.txt --extra dev --group build --group lock \
  && echo "requirements/*.txt are uv.lock's exports" \
  || { echo "requirements/*.txt differ from uv.lock's exports: run scripts/lock.sh" >&2; exit 1; }
echo "== ruff";          ruff check src tests benchmarks scripts
echo "== mypy";          mypy
echo "== mypy (tests)";  scripts/mypy_tests.sh
echo "== import rules";  lint-imports --no-cache >/dev/null && echo "all contracts kept"
echo "== agent and gateway: Python 3.9 compatibility (vermin)"
vermin --target=3.9- --violations --no-tips -q src/corral/agent/ && echo "src/corral/agent runs on Python 3.9+"
vermin --target=3.9- --violations --no-tips -q src/corral/gateway/ && echo "src/corral/gateway runs on Python 3.9+"
echo "== user guide (mkdocs build --strict)"
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$(mktemp -d)" && echo "docs build"
echo "== YAML corpus (configuration models)"
python scripts/check_yaml_corpus.py
echo "== YAML corpus (plan endpoints of a running server)"
python scripts/corpus_against_server.py
echo "== branch coverage of the pure core (domain, scheduler, gateway.core, Slurm's parsers and offers: [tool.coverage])"
coverage run -m pytest -q -p no:cacheprovider tests/domain tests/scheduler tests/gateway/core \
  tests/slurm/test_slurm_parse.py tests/slurm/test_slurm_offer_rules.py \
  tests/slurm/test_slurm_time_limits.py >/dev/null
total=$(coverage report --format=total) \
  || { coverage report; echo "the pure core's coverage fell below the floor (fail_under)" >&2; rm -f .coverage; exit 1; }
rm -f .coverage
echo "domain, scheduler and gateway.core: ${total}% covered (lines and branches)"
# Two workers, each a whole test file at a time (module fixtures: one server, one fleet per file), so one
# worker's waits on subprocesses overlap the other's work. CORRAL_TEST_WORKERS=0 runs the suite in-process.
echo "== pytest (${CORRAL_TEST_WORKERS:-2} workers)"
if [ "${CORRAL_TEST_WORKERS:-2}" = 0 ]; then
  python -m pytest -q "$@"
else
  python -m pytest -q -n "${CORRAL_TEST_WORKERS:-2}" --dist loadfile "$@"
fi
