#!/usr/bin/env bash
# examples/nginx/upstream-demo.sh -- fuse.upstream narrated: a peer fails, is skipped,
# probed, slow-started and restored; then the peer list changes at run time. Run by `make demo-nginx` (after demo.sh's single breaker).
# Starts README's "Upstream peers" config (tools/readme-block upstream-nginx, 4 workers)
# and examples/nginx/peers.conf (three fake peers) in a temp prefix on free loopback
# ports, and stops both by their pids.
set -u

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"   # alive, stop_master, pick_ports...: shared with the tests
NGINX=$(nginx_bin)
die() { echo "upstream-demo: $*" >&2; exit 1; }
[ -x "$NGINX" ] || die "nginx is not installed (Debian: nginx libnginx-mod-http-lua lua-resty-core)"
command -v curl >/dev/null || die "curl is not installed"
[ -r "$ROOT/build/fuse/core.so" ] || die "build/fuse/core.so is missing: run make first"

T=$(mktemp -d /tmp/fuse-upstream-demo.XXXXXX) || die "mktemp failed"
P=$T/examples/nginx F=$T/front
PIDS=()
trap 'cleanup_nginx "${PIDS[@]}"' EXIT   # stops nginx by its pids, removes the temp prefix
trap 'exit 1' INT TERM HUP

mkdir -p "$P/logs-peers" "$P/temp" "$F/logs"
copy_fuse "$T"
cp "$ROOT/examples/nginx/peers.lua" "$P/"
BASE=$(pick_ports 7) || die "no 7 free ports in a row"
FRONT=$BASE CTL=$((BASE + 2)) A=$((BASE + 3)) B=$((BASE + 4)) C=$((BASE + 5)) E=$((BASE + 6))
ports() {
  sed -e "s/127\.0\.0\.1:18088/127.0.0.1:$FRONT/g" -e "s/127\.0\.0\.1:18090/127.0.0.1:$CTL/g" \
    -e "s/127\.0\.0\.1:18091/127.0.0.1:$A/g" -e "s/127\.0\.0\.1:18092/127.0.0.1:$B/g" \
    -e "s/127\.0\.0\.1:18093/127.0.0.1:$C/g" -e "s/127\.0\.0\.1:18094/127.0.0.1:$E/g"
}
ports < "$ROOT/examples/nginx/peers.conf" > "$P/peers.conf"
"$ROOT/tools/readme-block" upstream-nginx | ports | sed "s#/path/to/fuse/#$T/#g" > "$F/nginx.conf"
chmod -R a+rX "$T"
"$NGINX" -p "$P/" -c peers.conf || die "the peers did not start"
PIDS+=("$(cat "$P/logs-peers/nginx.pid")")
"$NGINX" -p "$F/" -c nginx.conf -g "pid logs/nginx.pid; error_log logs/error.log warn;" ||
  die "nginx did not start: $(tail -n 5 "$F/logs/error.log")"
PIDS+=("$(cat "$F/logs/nginx.pid")")
for _ in $(seq 50); do curl -s -m 1 -o /dev/null "http://127.0.0.1:$FRONT/metrics" && break; sleep 0.1; done

name() { case $1 in "$A") echo A ;; "$B") echo B ;; "$C") echo C ;; "$E") echo E ;; *) echo "-" ;; esac; }
get() { # one request; prints "status from peer X"
  local out
  out=$(curl -s -m 5 -o /dev/null -w '%{http_code} %header{x-peer}' "http://127.0.0.1:$FRONT/")
  printf '%s from peer %s' "${out%% *}" "$(name "${out#* }")"
}
mode() { curl -s -m 5 "http://127.0.0.1:$CTL/control?port=$1&$2" > /dev/null; }
hits() { curl -s -m 5 "http://127.0.0.1:$CTL/control?port=$1" | sed -n 's/^hits=\([0-9]*\).*/\1/p'; }
states() {
  local m s
  m=$(curl -s -m 5 "http://127.0.0.1:$FRONT/metrics")
  for p in $A $B $C; do
    s=$(grep -F "fuse_state{name=\"backend/127.0.0.1:$p\"}" <<< "$m" | awk '{ print $2 }')
    case $s in 0) s=closed ;; 1) s=open ;; 2) s=half_open ;; esac
    printf '   %s (127.0.0.1:%s): %s\n' "$(name "$p")" "$p" "$s"
  done
}
say() { printf '\n== %s\n' "$*"; }
round() { local i line=""; for i in $(seq "$1"); do line="$line  $(get | cut -d' ' -f1,4)"; done; echo "  $line"; }

say "pool 'backend': peers A B C, 4 nginx workers sharing one breaker per peer"
echo "   fails=3 open_for=5 probes=1, max_ejected 0.5 (at most 1 of 3 peers skipped)"
echo "   each request below shows: status, peer that answered"
say "healthy: 9 requests"
round 9

say "peer B starts failing (HTTP 500); requests one after another:"
mode "$B" 'mode=fail&reset=1'
for i in $(seq 12); do
  printf '   #%-2d %s\n' "$i" "$(get)"
  sleep 0.02
done
echo "   -> B saw $(hits "$B") requests: its 3rd failure opened its breaker in every worker;"
echo "      each failure was retried on another peer (proxy_next_upstream), so clients saw 200"
states

say "B still sick; after open_for, 20 requests at once: one probe reaches B"
mode "$B" 'mode=slowfail&delay=0.5&reset=1'
sleep 5
curl -s -m 10 --no-progress-meter --parallel --parallel-immediate -o /dev/null \
  -w '%{http_code}\n' "http://127.0.0.1:$FRONT/?i=[1-20]" | sort | uniq -c | sed 's/^/   /'
echo "   -> B saw $(hits "$B") request (probes=1, across all workers); it failed and B re-opened"

say "B heals; after its open period the next probe succeeds, B's breaker closes, and"
echo "   slow_start = 10 ramps B's weight from 10% to 100% (the same in every worker):"
mode "$B" 'mode=ok&reset=1'
b_back() { curl -s -o /dev/null -m 5 "http://127.0.0.1:$FRONT/"; [ "$(hits "$B")" -ge 1 ]; }
wait_for 15 b_back || echo "   (B not probed within 15 s)"
states
t0=$SECONDS
for r in 1 2 3 4 5 6; do
  mode "$B" 'mode=ok&reset=1'
  n=0
  for _ in $(seq 30); do curl -s -m 5 -o /dev/null "http://127.0.0.1:$FRONT/"; n=$((n + 1)); done
  printf '   %2d s after closing: B served %2d of %d requests (A and C the rest)\n' "$((SECONDS - t0))" "$(hits "$B")" "$n"
  sleep 1.5
done
echo "   -> a third of them at full weight: B is restored"

say "the peer list changes at run time: POST /peers [A, C, E] (any worker; every worker's next pick)"
curl -s -m 5 -d "[\"127.0.0.1:$A\", \"127.0.0.1:$C\", \"127.0.0.1:$E\"]" "http://127.0.0.1:$FRONT/peers" | sed 's/^/   /'
for p in $A $B $C $E; do mode "$p" 'mode=ok&reset=1'; done
round 12
echo "   -> B served $(hits "$B"), E $(hits "$E"); B's breaker left the registry:"
curl -s -m 5 "http://127.0.0.1:$FRONT/metrics" | grep -c "backend/127.0.0.1:$B\"" | sed 's/^/   series of B in \/metrics: /'

say "/metrics (excerpt):"
curl -s -m 5 "http://127.0.0.1:$FRONT/metrics" | grep -E "^fuse_(state|failures_total|opens_total)\{name=\"backend/127.0.0.1:$A\"|^fuse_upstream_(panic|failures)_total" | sed 's/^/   /'
say "stopping nginx"
