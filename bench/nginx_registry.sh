#!/usr/bin/env bash
# bench/nginx_registry.sh -- requests/s of a location that looks its breaker up by name on
# every request, with 10 and with 50,000 names, side by side (make bench-nginx-registry).
#
# nginx, 2 workers, fuse.init{ shared = true, capacity = 65536 }; init_by_lua creates the
# breakers "h-1" .. "h-50000". The location runs
#     local b = fuse.new{ name = ngx.var.arg_n, fails = 5 }; b:call(ok)
# wrk (1 thread, 16 connections) asks for the names of one set in turn: "10" cycles over
# h-1..h-10, "50000" over h-1..h-50000. ROUNDS (3) rounds of SECS (4) s each, the two
# sets alternating; the median requests/s of each and their ratio are printed.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
NGINX=$(nginx_bin) || { echo "bench-nginx-registry: nginx is not installed" >&2; exit 1; }
ROUNDS=${ROUNDS:-3} SECS=${SECS:-4}
command -v wrk >/dev/null || { echo "bench-nginx-registry: wrk is not installed" >&2; exit 1; }
[ -r "$ROOT/build/fuse/core.so" ] || { echo "run make first" >&2; exit 1; }

T=$(mktemp -d /tmp/fuse-bench-registry.XXXXXX)
MASTER=
trap 'cleanup_nginx "$MASTER"' EXIT
mkdir -p "$T/p/logs" "$T/p/temp"
copy_fuse "$T"
PORT=$(pick_ports 1)

cat > "$T/p/nginx.conf" <<EOF
$(nginx_load_modules)
worker_processes 2;
pid logs/nginx.pid;
error_log logs/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
$(nginx_temp_paths)
$(nginx_lua_paths "$T")
    init_by_lua_block {
        local fuse = require "fuse"
        fuse.init{ shared = true, capacity = 65536 }
        for i = 1, 50000 do fuse.new{ name = "h-" .. i, fails = 5 } end
    }
    server {
        listen 127.0.0.1:$PORT;
        location /a {
            content_by_lua_block {
                local b = require("fuse").new{ name = ngx.var.arg_n, fails = 5 }
                ngx.say(b:call(function() return "ok" end))
            }
        }
    }
}
EOF
"$NGINX" -p "$T/p/" -c nginx.conf
for _ in $(seq 100); do [ -r "$T/p/logs/nginx.pid" ] && break; sleep 0.1; done
MASTER=$(cat "$T/p/logs/nginx.pid")
for _ in $(seq 100); do curl -s "http://127.0.0.1:$PORT/a?n=h-1" >/dev/null && break; sleep 0.1; done

cat > "$T/cycle.lua" <<'EOF'
function init(args) n, size = 0, tonumber(args[1]) end
function request()
  n = n % size + 1
  return wrk.format(nil, "/a?n=h-" .. n)
end
EOF

declare -A got
for set in 10 50000; do  # warm-up
  wrk -t1 -c16 -d1s -s "$T/cycle.lua" "http://127.0.0.1:$PORT/a" -- "$set" >/dev/null
done
for r in $(seq "$ROUNDS"); do
  for set in 10 50000; do
    rps=$(wrk -t1 -c16 -d"${SECS}s" -s "$T/cycle.lua" "http://127.0.0.1:$PORT/a" -- "$set" |
      awk '/^Requests\/sec/ {print $2}')
    got[$set]="${got[$set]:-} $rps"
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
m10=$(echo "${got[10]}" | median) m50=$(echo "${got[50000]}" | median)
echo "nginx, 2 workers, fuse.new{ name = arg, fails = 5 } + b:call per request (load $(cut -d' ' -f1 /proc/loadavg))"
echo "names     requests/s (median of $ROUNDS x ${SECS}s)   rounds"
printf '%-9s %-34s %s\n' 10 "$m10" "${got[10]}"
printf '%-9s %-34s %s\n' 50000 "$m50" "${got[50000]}"
awk -v a="$m50" -v b="$m10" 'BEGIN { printf "50000 / 10: %.2f\n", a / b }'
grep -E '\[(error|crit|alert|emerg)\]' "$T/p/logs/error.log" | head -n 3 || true
