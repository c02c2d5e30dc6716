#!/usr/bin/env bash
# bench/nginx_isolation.sh -- the point of a bulkhead, measured (`make bench-nginx`,
# after nginx_upstream.sh; bounded: about 2 * DURATION + 15 s).
#
# examples/nginx/isolation.conf (4 workers, worker_connections 96) in front of
# examples/nginx/slow-upstream.conf (every request takes 2 s), twice: /slow through the
# breaker 'slow' with max_concurrent = 20, then the same without a limit
# (ISOLATION_LIMIT=0). Each time 200 wrk connections hammer /slow for DURATION seconds
# (default 20) while 8 others use the healthy /fast on the same server. Reported for
# each side: the requests/s /fast served (and its socket errors, also per answered
# request), /slow's answers (2xx and 503), and the most requests the upstream held at once.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
NGINX=$(nginx_bin)
DURATION=${DURATION:-20}
die() { echo "bench-nginx: $*" >&2; exit 1; }
[ -x "$NGINX" ] || die "nginx is not installed"
command -v wrk >/dev/null || die "wrk is not installed"
[ -r "$ROOT/build/fuse/core.so" ] || die "build/fuse/core.so is missing: run make first"

T=$(mktemp -d /tmp/fuse-bench-isolation.XXXXXX) || die "mktemp failed"
P=$T/examples/nginx
PIDS=()
trap 'cleanup_nginx "${PIDS[@]}"' EXIT
trap 'exit 1' INT TERM HUP
mkdir -p "$P/logs" "$P/logs-up" "$P/temp"
copy_fuse "$T"
chmod -R a+rX "$T"

# side LIMIT: one run; prints a line of results
side() {
  LIMIT=$1
  ISOLATION_LIMIT=$LIMIT start_isolation_example "$P" || die "nginx did not start: $NGINX_START_ERR"
  wait_for 30 curl -s -m 2 -o /dev/null "http://127.0.0.1:$PORT/fast" || die "nginx does not answer"
  wrk -t 2 -c 200 -d "${DURATION}s" --timeout 10s "http://127.0.0.1:$PORT/slow" > "$T/slow.out" 2>&1 &
  local slow=$!
  sleep 1   # /slow's clients first: the healthy location comes under a server already loaded
  wrk -t 1 -c 8 -d "$((DURATION - 2))s" --timeout 5s "http://127.0.0.1:$PORT/fast" > "$T/fast.out" 2>&1
  wait $slow
  local fast_rps fast_err fast_per slow_all slow_503 top
  fast_rps=$(awk '/Requests\/sec/ { print $2 }' "$T/fast.out")
  fast_err=$(awk '/Socket errors/ { print $0 }' "$T/fast.out" | sed 's/^ *//')
  # /fast's failed connections (connect, read, write, timeout) per request it got an
  # answer to: a server short of connections resets them, and wrk counts only answers
  # in req/s, so that req/s alone can read well while most attempts fail
  fast_per=$(awk '/requests in/ { n = $1 } /Socket errors/ { gsub(",", ""); e = $4 + $6 + $8 + $10 }
    END { printf "%.4f", (n > 0 ? e / n : 0) }' "$T/fast.out")
  slow_all=$(awk '/requests in/ { print $1 }' "$T/slow.out")
  slow_503=$(awk '/Non-2xx/ { print $NF }' "$T/slow.out")
  top=$(curl -s -m 2 "http://127.0.0.1:$UP/level" | cut -d' ' -f1)
  printf '%-22s /fast %10s req/s (%s failed connections per answer)   /slow %7s answers (%s 503)   upstream held at most %s   %s\n' \
    "$2" "${fast_rps:-0}" "$fast_per" "${slow_all:-0}" "${slow_503:-0}" "${top:-?}" "${fast_err:-}"
  local pid
  for pid in "${PIDS[@]}"; do stop_master "$pid"; done
  PIDS=()
  rm -rf "$P/logs"/* "$P/logs-up"/*
}

echo "# 200 connections on /slow (2 s upstream) and 8 on /fast, ${DURATION} s; 4 workers, worker_connections 96"
side 20 "max_concurrent = 20"
side 0 "no limit"
