#!/usr/bin/env bash
# test/prometheus-rules.t.sh -- the example alert rules are valid and behave as their
# unit tests say (prints TAP): promtool check rules, promtool test rules.
# Without promtool (Debian: prometheus) it skips, except under CI=true, where it fails.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=$ROOT/examples/prometheus
echo "TAP version 13"
if ! command -v promtool >/dev/null; then
  if [ "${CI:-}" = true ]; then echo "1..1"; echo "not ok 1 - promtool is not installed (CI)"; exit 1; fi
  echo "1..0 # SKIP promtool is not installed"; exit 0
fi
n=0 failed=0
run() { # run DESCRIPTION COMMAND...
  local d=$1 out; shift
  n=$((n + 1))
  if out=$(cd "$DIR" && "$@" 2>&1); then echo "ok $n - $d"
  else failed=$((failed + 1)); echo "not ok $n - $d"; printf '%s\n' "$out" | sed 's/^/# /'; fi
}
run "promtool check rules fuse-alerts.yml" promtool check rules fuse-alerts.yml
run "promtool test rules fuse-alerts.test.yml (FuseCircuitOpen, FuseCircuitFlapping, FuseBreakerFull)" \
  promtool test rules fuse-alerts.test.yml
echo "1..$n"
[ "$failed" -eq 0 ]
