#!/usr/bin/env bash
# bench/nginx_scrape.sh -- how long the other requests of an nginx worker wait while it
# serves a /metrics scrape of 100,000 named breakers (make bench-nginx-scrape).
#
# nginx, 2 workers, fuse.init{ shared = true, capacity = 131072 }; init_by_lua makes N
# (100000) breakers. /metrics is README's location (fuse.metrics_chunks(ngx.print); in a
# tree without it, ngx.print(fuse.metrics())), which also answers the worker's pid in
# X-Pid; /ping answers the worker's pid. The listener
# has reuseport, so that each connection lands on a worker at random.
#
# A round, per tree: STREAMS (6) ping streams, each one curl on one keep-alive
# connection asking /ping RATE (200) times a second for SECS (8) s, each answer's
# latency as curl measures it (time_total); first with nothing else (the "idle" rows),
# then again while one more curl on one connection scrapes /metrics SCRAPES (5) times,
# one every SECS / SCRAPES s. The pings are split by the worker that answered them: the
# scrapes' worker (W) and the other. A ping that reaches W during a scrape waits for the
# scrape unless it yields. Printed per tree: the pings' p50, p99 and max in ms, the
# pings over 20 ms, and the scrapes' wall time (median). ROUNDS (2) rounds, the trees'
# order swapped each round; a round whose streams all landed on one worker says so.
#
# BASE=DIR (a tree with lua/ and a built build/fuse/core.so, e.g. make bench-side's
# build/base/<commit>): that tree's fuse runs in a second nginx beside this one, measured
# in the same rounds.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
NGINX=$(nginx_bin) || { echo "bench-nginx-scrape: nginx is not installed" >&2; exit 1; }
N=${N:-100000} ROUNDS=${ROUNDS:-2} SECS=${SECS:-8} STREAMS=${STREAMS:-6} RATE=${RATE:-200}
SCRAPES=${SCRAPES:-5} BASE=${BASE:-}
side_trees bench-nginx-scrape

start_tree() {  # start_tree INDEX NAME (see test/lib/nginx.sh, side_trees)
  cat > "$T/$2/p/nginx.conf" <<EOF
$(side_tree_head "$2")
    init_by_lua_block {
        local fuse = require "fuse"
        fuse.init{ shared = true, capacity = 131072 }
        for i = 1, $N do fuse.new{ name = "bench.scrape.host-" .. i .. ".example.com", fails = 5 } end
    }
    server {
        listen 127.0.0.1:${PORTS[$1]} reuseport;
        location = /metrics {
            default_type "text/plain; version=0.0.4";
            content_by_lua_block {
                ngx.header["X-Pid"] = ngx.worker.pid()
                local fuse = require "fuse"
                if fuse.metrics_chunks then fuse.metrics_chunks(ngx.print)
                else ngx.print(fuse.metrics()) end
            }
        }
        location = /ping { content_by_lua_block { ngx.print(ngx.worker.pid()) } }
    }
}
EOF
  side_tree_run "$1" "$2" "/ping"
}

side_trees_start

NPING=$((RATE * SECS))
# pings TREE_INDEX OUT: STREAMS ping streams at once, "PID SECONDS" lines into OUT.s*
pings() {
  local k pids=()
  for k in $(seq "$STREAMS"); do
    curl -s --rate "$RATE/s" -w ' %{time_total}\n' "http://127.0.0.1:${PORTS[$1]}/ping?i=[1-$NPING]" > "$2.s$k" &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k"; done
}
# scrapes TREE_INDEX OUT: SCRAPES scrapes on one connection, "SECONDS PID" lines into OUT
scrapes() {
  local per_min=$((SCRAPES * 60 / SECS))
  curl -s -o /dev/null --rate "$per_min/m" -w '%{time_total} %header{x-pid}\n' \
    "http://127.0.0.1:${PORTS[$1]}/metrics?i=[1-$SCRAPES]" > "$2"
}

# summary ROWNAME PID_FILTER(=W|!W) W FILES...: p50 p99 max (ms), pings over 20 ms
summary() {
  local row=$1 which=$2 w=$3
  shift 3
  cat "$@" | awk -v w="$w" -v which="$which" '
    { if ((which == "W") == ($1 == w)) print $2 * 1000 }' | sort -n | awk -v row="$row" '
    { a[NR] = $1; if ($1 > 20) slow++ }
    END {
      if (NR == 0) { printf "    %-26s no pings\n", row; exit }
      printf "    %-26s %6d pings  p50 %6.2f  p99 %7.2f  max %7.1f ms  over 20 ms: %d\n", row, NR,
        a[int(NR * 0.5) + 1], a[int(NR * 0.99) + 1], a[NR], slow }'
}

echo "nginx, 2 workers, $N named breakers; $STREAMS ping streams at $RATE/s each, $SECS s;" \
  "$SCRAPES scrapes of /metrics on one connection (load $(cut -d' ' -f1 /proc/loadavg))"
for r in $(seq "$ROUNDS"); do
  order=("${!TREES[@]}")
  if [ $((r % 2)) = 0 ] && [ ${#TREES[@]} = 2 ]; then order=(1 0); fi
  for i in "${order[@]}"; do
    name=${TREES[$i]}
    [ "$name" = base ] && name="base ($BASE)"
    out="$T/r$r-$i"
    pings "$i" "$out.idle"
    scrapes "$i" "$out.scrapes" &
    sp=$!
    pings "$i" "$out.busy"
    wait "$sp"
    w=$(awk 'NR == 1 { print $2 }' "$out.scrapes")
    on_w=$(cat "$out.busy".s* | awk -v w="$w" '$1 == w' | wc -l)
    echo "== round $r, $name: scrapes on worker $w, wall time (median of $SCRAPES)" \
      "$(awk '{ print $1 }' "$out.scrapes" | sort -n | awk '{ a[NR] = $1 } END { printf "%.3f s", a[int((NR + 1) / 2)] }')"
    [ "$on_w" -gt 0 ] || echo "    (no ping stream landed on worker $w this round)"
    summary "idle, worker W" W "$w" "$out.idle".s*
    summary "idle, the other worker" '!W' "$w" "$out.idle".s*
    summary "scraping, worker W" W "$w" "$out.busy".s*
    summary "scraping, the other worker" '!W' "$w" "$out.busy".s*
  done
done
for i in "${!TREES[@]}"; do
  grep -E '\[(error|crit|alert|emerg)\]' "$T/${TREES[$i]}/p/logs/error.log" | head -n 3 || true
done
