#!/usr/bin/env bash
# The README's pictures of the Dagster UI (docs/*.png), taken over the demo's instance: `make demo`
# first, then `bash docs/screenshots.sh`. It starts `kts ui` on a spare port, waits until the code
# location is loaded, and has Debian's headless Chromium (`apt-get install chromium`) draw each page.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-3311}
URL=http://127.0.0.1:$PORT
export KTS_HOME=${KTS_HOME:-$PWD/.kts} KTS_LOG_DIRS=${KTS_LOG_DIRS:-$PWD/.kts/demo-logs}
log=$(mktemp)
.venv/bin/kts ui --port "$PORT" >"$log" 2>&1 &
ui=$!
trap 'kill -TERM $ui 2>/dev/null; wait $ui 2>/dev/null || true; rm -f "$log"' EXIT
query='{"query":"{ locationStatusesOrError { ... on WorkspaceLocationStatusEntries { entries { loadStatus } } } }"}'
for _ in $(seq 1 300); do
  if curl -sf -H 'Content-Type: application/json' -d "$query" "$URL/graphql" 2>/dev/null | grep -q '"LOADED"'; then break; fi
  kill -0 $ui 2>/dev/null || { cat "$log"; exit 1; }
  sleep 1
done
shoot() {  # NAME PATH: the page at PATH, as docs/NAME.png
  local profile; profile=$(mktemp -d)
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$profile" --window-size=1440,1000 \
    --virtual-time-budget=20000 --screenshot="docs/$1.png" "$URL$2" 2>/dev/null
  rm -rf "$profile"
  echo "docs/$1.png: $2"
}
shoot remote-segments-partition "/assets/remote_segments?view=partitions&partition=orders-0"
shoot remote-tier "/assets/remote_tier"
shoot runs "/runs"
