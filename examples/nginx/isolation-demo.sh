#!/usr/bin/env bash
# examples/nginx/isolation-demo.sh -- a bulkhead held across 4 nginx workers, narrated
# (`make demo-nginx` runs it after demo.sh). Starts examples/nginx/isolation.conf (the
# front, max_concurrent = 20 on /slow) and examples/nginx/slow-upstream.conf (every
# request takes 2 s) on free loopback ports; 100 clients hammer /slow for 6 s while 4
# others use the healthy /fast; prints what the upstream held each second and what /fast
# served. Stops both by their pids.
set -u

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
NGINX=$(nginx_bin)
die() { echo "demo-nginx: $*" >&2; exit 1; }
command -v "$NGINX" >/dev/null || die "nginx is not installed (Debian: nginx libnginx-mod-http-lua)"
command -v wrk >/dev/null || die "wrk is not installed"
command -v curl >/dev/null || die "curl is not installed"
[ -r "$ROOT/build/fuse/core.so" ] || die "build/fuse/core.so is missing: run make first"

T=$(mktemp -d /tmp/fuse-isolation-demo.XXXXXX) || die "mktemp failed"
P=$T/examples/nginx
PIDS=()
trap 'cleanup_nginx "${PIDS[@]}"' EXIT
trap 'exit 1' INT TERM HUP
mkdir -p "$P/logs" "$P/logs-up" "$P/temp"
copy_fuse "$T"
chmod -R a+rX "$T"

start_isolation_example "$P" || die "nginx did not start: $NGINX_START_ERR"
front() { curl -s -m 5 "http://127.0.0.1:$PORT$1"; }
wait_for 30 front /stats >/dev/null || die "nginx does not answer"

printf '\n== front http://127.0.0.1:%s (4 workers, worker_connections 96), slow upstream :%s (2 s a request)\n' "$PORT" "$UP"
echo "   /slow: breaker 'slow', max_concurrent = 20, one limit for all 4 workers (fuse.init{shared=true})"
echo "   /fast: a healthy location on the same server"
printf '\n== 100 clients on /slow and 4 on /fast, for 6 s\n'
wrk -t 2 -c 100 -d 6s "http://127.0.0.1:$PORT/slow" > "$T/slow.out" 2>&1 &
SLOWW=$!
wrk -t 1 -c 4 -d 6s "http://127.0.0.1:$PORT/fast" > "$T/fast.out" 2>&1 &
FASTW=$!
for s in 1 2 3 4 5 6; do
  sleep 1
  read -r top now <<< "$(curl -s -m 2 "http://127.0.0.1:$UP/level")"
  read -r running full <<< "$(front /stats)"
  printf '   t=%ds  upstream holds %3s (most ever %s)   running %3s   rejected for the limit so far %s\n' \
    "$s" "$now" "$top" "$running" "$full"
done
wait $SLOWW $FASTW
ok=$(awk '/requests in/ { print $1 }' "$T/slow.out")
non2xx=$(awk '/Non-2xx/ { print $NF }' "$T/slow.out")
printf '\n== /slow: %s answers, %s of them 503 (fuse.reject: full, Retry-After)\n' "$ok" "${non2xx:-0}"
echo "   -> the upstream never held more than 20, whichever worker the calls came through"
printf '== /fast meanwhile: %s requests/s\n' "$(awk '/Requests\/sec/ { print $2 }' "$T/fast.out")"
echo "   -> the healthy location kept serving: calls past the limit are answered at once"
echo "      instead of holding a connection for 2 s each (make bench-nginx: with and without the limit)"
