#!/usr/bin/env bash
# bench/nginx_registry.sh -- requests/s of a location that looks its breaker up by name on
# every request, with 10 and with 50,000 names, side by side (make bench-nginx-registry).
#
# nginx, 2 workers, fuse.init{ shared = true, capacity = 65536 }; init_by_lua creates the
# breakers "h-1" .. "h-50000". The location runs
#     local b = fuse.new{ name = ngx.var.arg_n, fails = 5 }; b:call(ok)
# wrk (1 thread, 16 connections) asks for the names of one set in turn: "10" cycles over
# h-1..h-10, "50000" over h-1..h-50000. ROUNDS (3) rounds of SECS (4) s each, the two
# sets alternating; the median requests/s of each and their ratio are printed, with each
# round's own ratio (its two runs were next to each other) and the workers' CPU time per
# request of each set (utime + stime of the two workers over the run, from /proc, divided
# by the requests wrk counted): on a loaded machine the CPU time per request moves less
# than the requests per second, and CPU(10) / CPU(50000) is the ratio the workers alone
# would give.
#
# BASE=DIR (a tree with lua/ and a built build/fuse/core.so, e.g. make bench-side's
# build/base/<commit>): that tree's fuse runs in a second nginx beside this one, and each
# round runs both, the order of the two swapped every round, so the two are measured
# side by side in one run.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
NGINX=$(nginx_bin) || { echo "bench-nginx-registry: nginx is not installed" >&2; exit 1; }
ROUNDS=${ROUNDS:-3} SECS=${SECS:-4} BASE=${BASE:-}
command -v wrk >/dev/null || { echo "bench-nginx-registry: wrk is not installed" >&2; exit 1; }
side_trees bench-nginx-registry

start_tree() {  # start_tree INDEX NAME (see test/lib/nginx.sh, side_trees)
  cat > "$T/$2/p/nginx.conf" <<EOF
$(side_tree_head "$2")
    init_by_lua_block {
        local fuse = require "fuse"
        fuse.init{ shared = true, capacity = 65536 }
        for i = 1, 50000 do fuse.new{ name = "h-" .. i, fails = 5 } end
    }
    server {
        listen 127.0.0.1:${PORTS[$1]};
        location /a {
            content_by_lua_block {
                local b = require("fuse").new{ name = ngx.var.arg_n, fails = 5 }
                ngx.say(b:call(function() return "ok" end))
            }
        }
    }
}
EOF
  side_tree_run "$1" "$2" "/a?n=h-1"
}

side_trees_start

cat > "$T/cycle.lua" <<'EOF'
function init(args) n, size = 0, tonumber(args[1]) end
function request()
  n = n % size + 1
  return wrk.format(nil, "/a?n=h-" .. n)
end
EOF

# CPU ticks (utime + stime) of the workers of master $1
worker_ticks() {
  local sum=0 pid
  for pid in $(ps -o pid= --ppid "$1"); do
    sum=$((sum + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
  done
  echo "$sum"
}
HZ=$(getconf CLK_TCK)

declare -A got cpu
run() {  # run TREE_INDEX SET SECONDS -> "requests/s cpu-us-per-request"
  local port=${PORTS[$1]} t0 t1 out
  t0=$(worker_ticks "${MASTER_OF[$1]}")
  out=$(wrk -t1 -c16 -d"$3s" -s "$T/cycle.lua" "http://127.0.0.1:$port/a" -- "$2")
  t1=$(worker_ticks "${MASTER_OF[$1]}")
  echo "$out" | awk -v dt=$((t1 - t0)) -v hz="$HZ" '
    /requests in/ { n = $1 } /^Requests\/sec/ { r = $2 }
    END { printf "%s %.2f\n", r, (n > 0 ? dt / hz * 1e6 / n : 0) }'
}

for i in "${!TREES[@]}"; do for set in 10 50000; do run "$i" "$set" 1 >/dev/null; done; done  # warm-up
for r in $(seq "$ROUNDS"); do
  order=("${!TREES[@]}")
  if [ $((r % 2)) = 0 ] && [ ${#TREES[@]} = 2 ]; then order=(1 0); fi
  for i in "${order[@]}"; do
    for set in 10 50000; do
      read -r rps us <<<"$(run "$i" "$set" "$SECS")"
      got[$i,$set]="${got[$i,$set]:-} $rps"
      cpu[$i,$set]="${cpu[$i,$set]:-} $us"
    done
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "nginx, 2 workers, fuse.new{ name = arg, fails = 5 } + b:call per request (load $(cut -d' ' -f1 /proc/loadavg))"
for i in "${!TREES[@]}"; do
  name=${TREES[$i]}
  [ "$name" = base ] && name="base ($BASE)"
  [ ${#TREES[@]} = 2 ] && echo "== $name"
  echo "names     requests/s (median of $ROUNDS x ${SECS}s)   rounds"
  m10=$(echo "${got[$i,10]}" | median) m50=$(echo "${got[$i,50000]}" | median)
  printf '%-9s %-34s %s\n' 10 "$m10" "${got[$i,10]}"
  printf '%-9s %-34s %s\n' 50000 "$m50" "${got[$i,50000]}"
  awk -v a="$m50" -v b="$m10" 'BEGIN { printf "50000 / 10: %.2f\n", a / b }'
  read -r -a a10 <<<"${got[$i,10]}"
  read -r -a a50 <<<"${got[$i,50000]}"
  ratios=""
  for k in "${!a10[@]}"; do ratios="$ratios $(awk -v a="${a50[$k]}" -v b="${a10[$k]}" 'BEGIN { printf "%.2f", a / b }')"; done
  echo "each round's 50000 / 10:$ratios (median $(echo "$ratios" | median))"
  c10=$(echo "${cpu[$i,10]}" | median) c50=$(echo "${cpu[$i,50000]}" | median)
  echo "workers' CPU us per request (medians): 10 names $c10, 50000 names $c50;" \
    "10 / 50000: $(awk -v a="$c10" -v b="$c50" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')"
  grep -E '\[(error|crit|alert|emerg)\]' "$T/${TREES[$i]}/p/logs/error.log" | head -n 3 || true
done
