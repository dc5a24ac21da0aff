#!/usr/bin/env bash
# The main job on the embedded default (SQLite + the local backend): install corral, start the server,
# apply a fleet and a task on this machine, and show the task's output. Stops the server at the end
# unless --keep is given.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
PORT=${CORRAL_SERVER_PORT:-3000}
LOG=${TMPDIR:-/tmp}/corral-demo-server.log
keep=0; [ "${1:-}" = "--keep" ] && keep=1

if curl -fsS "http://127.0.0.1:$PORT/healthcheck" >/dev/null 2>&1; then
  echo "A server this script did not start already answers on port $PORT: using it, and leaving it running."
  echo "The CLI talks to the default project in ${CORRAL_CONFIG_DIR:-~/.corral}/config.yml; to use a server of"
  echo "the demo's own instead, stop that one or pick a free port: CORRAL_SERVER_PORT=3001 scripts/demo.sh"
  started=0
else
  echo "Starting corral server on 127.0.0.1:$PORT (log: $LOG)"
  corral server --port "$PORT" >"$LOG" 2>&1 &
  server_pid=$!
  started=1
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$PORT/healthcheck" >/dev/null 2>&1 && break
    kill -0 "$server_pid" 2>/dev/null || { echo "The corral server did not start:"; cat "$LOG"; exit 1; }
    sleep 0.1
  done
  grep -E "admin token|Configured|running at" "$LOG" || true
fi
cleanup() {
  if [ "$started" = 1 ] && [ "$keep" = 0 ]; then
    # Delete the example fleet so that its instance (an agent process) goes away with the server.
    corral fleet delete local-fleet -y >/dev/null 2>&1 || true
    for _ in $(seq 1 50); do
      corral fleet 2>/dev/null | grep -q local-fleet || break
      sleep 0.2
    done
    kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

corral apply -f examples/fleet.dstack.yml -y
corral apply -f examples/task.dstack.yml -y
corral ps -a
corral fleet
