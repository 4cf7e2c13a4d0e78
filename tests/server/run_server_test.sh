#!/usr/bin/env bash
# Runs one end-to-end server test: starts `dsinfer serve` on a free loopback port with the
# embedded model set, waits for GET /health = 200, runs tests/server/<name>.mjs against it
# (node; the openai_client test first installs the pinned `openai` npm package into the
# git-ignored tests/data/external/npm-openai/), then sends SIGTERM and requires exit 0.
# Per-test server flags are in the case below. Usage: run_server_test.sh NAME DSINFER_BIN. Exit 77 (ctest: skipped) when node, or for
# the promtool test promtool, is missing.
set -euo pipefail
name=$1
bin=$2
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
command -v node >/dev/null || { echo "node not found: skipped"; exit 77; }
if [[ $name == promtool ]] && ! command -v promtool >/dev/null; then
  echo "promtool not found (Debian package prometheus): skipped"; exit 77
fi

OPENAI_VERSION=6.49.0   # pinned: the official client the test drives
if [[ $name == openai_client ]]; then
  export OPENAI_NODE_DIR="$root/tests/data/external/npm-openai"
  if [[ ! -f $OPENAI_NODE_DIR/node_modules/openai/package.json ]] ||
     ! grep -q "\"version\": \"$OPENAI_VERSION\"" "$OPENAI_NODE_DIR/node_modules/openai/package.json"; then
    mkdir -p "$OPENAI_NODE_DIR"
    npm install --no-audit --no-fund --no-package-lock --silent --prefix "$OPENAI_NODE_DIR" "openai@$OPENAI_VERSION"
  fi
fi

# GET URL == 200? (node's fetch: no curl needed). With /health disabled (endpoint_flags)
# readiness is the server's "serve: ready" line instead.
healthy() {
  if [[ $name == endpoint_flags ]]; then grep -q '^serve: ready' "$work/server.log"; return; fi
  node -e 'fetch(process.argv[1]).then((r) => process.exit(r.status === 200 ? 0 : 1), () => process.exit(1))' "$1"
}

work=$(mktemp -d)
trap 'kill -9 $pid 2>/dev/null || true; rm -rf "$work"' EXIT
args=(serve --port 0 --threads 2)
case $name in
  openai_client) args+=(--api-key test-key --record-requests "$work/requests.jsonl"); export RECORD_FILE="$work/requests.jsonl" ;;
  errors) args+=(--api-key test-key --max-body-bytes 65536 --max-prompt-tokens 1000) ;;
  load) args+=(--max-running 16) ;;
  load_async) args+=(--max-running 16 --dflash-enable-async-prefetch); export EXPECT_PREFETCH=1 ;;
  sigterm) args+=(--drain-timeout 60 --max-running 8) ;;
  promtool) args+=(--max-running 8 --enable-metrics --enable-health-check=true) ;;
  dflash_log) args+=(--max-running 8 --log-dflash-details "$work/dflash.jsonl"); export DFLASH_LOG="$work/dflash.jsonl" ;;
  endpoint_flags) args+=(--max-running 8 --disable-metrics --enable-health-check=false) ;;
  *) args+=(--max-running 8) ;;
esac
"$bin" "${args[@]}" >"$work/server.log" 2>&1 &
pid=$!
port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/server.log" | head -1)
  if [[ -n $port ]] && healthy "http://127.0.0.1:$port/health"; then break; fi
  kill -0 $pid 2>/dev/null || { cat "$work/server.log"; echo "server exited during start-up"; exit 1; }
  sleep 0.2
done
healthy "http://127.0.0.1:$port/health" || { cat "$work/server.log"; echo "server not ready"; exit 1; }

# The accept backlog (ss's Send-Q of the listening socket) must hold a burst of clients:
# cpp-httplib's own is 5, which the server raises (a 128-client burst otherwise overflows it).
if [[ $name == load ]] && command -v ss >/dev/null; then
  backlog=$(ss -ltnH "sport = :$port" | awk '{print $3}' | head -1)
  if [[ -z $backlog || $backlog -lt 128 ]]; then echo "accept backlog '$backlog' < 128"; exit 1; fi
fi

rc=0
script=$name
[[ $name == load_async ]] && script=load  # the load test, with async prefetch on
node "$here/$script.mjs" "http://127.0.0.1:$port" "$pid" || rc=$?
kill -TERM $pid 2>/dev/null || true
src=0
wait $pid || src=$?
if ((rc != 0)); then echo "--- server log"; tail -50 "$work/server.log"; exit $rc; fi
if ((src != 0)); then echo "--- server log"; tail -50 "$work/server.log"; echo "server exit code $src after SIGTERM (want 0)"; exit 1; fi
echo "server drained and exited 0"
