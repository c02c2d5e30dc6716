#!/usr/bin/env bash
# test/registry.t.sh -- many breakers keyed at run time in a real nginx (prints TAP).
#
# 4 workers, fuse.init{ shared = true, capacity = 1000, idle = 1 }; a location keys its
# breaker by the request argument `name`. wrk feeds it 100,000 distinct names (fewer with
# REGISTRY_T_NAMES=N): every request must be answered 200, the error log must hold no
# error, the breakers tripped before the flood must still be open after it, and the
# workers' RSS must stay flat after the warm-up. Then a reload (HUP) with capacity 2000
# and other options for the tripped breakers: the new workers see the new capacity, the
# tripped breakers still open, their new options, and a notice in the log.
# Needs nginx with the Lua module and wrk. KEEP=1 keeps the temp prefix. About 40 s.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
NGINX=$(nginx_bin)
NAMES=${REGISTRY_T_NAMES:-100000}

# shellcheck source=test/lib/tap.sh
. "$ROOT/test/lib/tap.sh"   # ok, nok, diag, check, bail, skip, skip_all

echo "TAP version 13"
missing=
command -v "$NGINX" >/dev/null || missing="nginx"
nginx_has_lua || missing="$missing the nginx Lua module"
command -v wrk >/dev/null || missing="$missing wrk"
command -v curl >/dev/null || missing="$missing curl"
if [ -n "$missing" ]; then
  [ "${CI:-}" = true ] && bail "missing:$missing"
  echo "1..0 # SKIP missing:$missing"; exit 0
fi
[ -r "$ROOT/build/fuse/core.so" ] || bail "build/fuse/core.so missing: run make first"

T=$(mktemp -d /tmp/fuse-registry-test.XXXXXX) || bail "mktemp failed"
P=$T/prefix
MASTER=
trap 'cleanup_nginx "${MASTER:-$(cat "$P/logs/nginx.pid" 2>/dev/null)}"' EXIT
watchdog 150

mkdir -p "$P/logs" "$P/temp"
copy_fuse "$T"

# docs/many-breakers.md's blocks, as printed (the init block gets the tripped breakers before its end)
INIT=$("$ROOT/tools/readme-block" many-breakers-init "$ROOT/docs/many-breakers.md") || bail "docs/many-breakers.md: no block many-breakers-init"
LOC=$("$ROOT/tools/readme-block" many-breakers-location "$ROOT/docs/many-breakers.md") || bail "docs/many-breakers.md: no block many-breakers-location"
case "$INIT" in *"capacity = 1000, idle = 1"*) ;; *) bail "docs/many-breakers.md's init block no longer says capacity = 1000, idle = 1";; esac

# conf CAPACITY FAILS: the config, with the registry's capacity and the tripped
# breakers' fails (a reload changes both).
conf() {
  local init
  init=$(printf '%s\n' "$INIT" | sed -e "s/capacity = 1000/capacity = $1/" -e '$d')
  init="$init
    -- ten breakers tripped before the flood; a reload reconfigures them
    for i = 1, 10 do fuse.new{ name = \"trip-\" .. i, fails = $2, window = 60, open_for = 3600 } end
}"
  cat > "$P/nginx.conf" <<EOF
$(nginx_conf_head "$T" 4 notice 1024)
$init
    server {
        listen 127.0.0.1:$PORT reuseport;
$LOC
        location /trip {
            content_by_lua_block {
                local b = require("fuse").get(ngx.var.arg_name)
                for _ = 1, 3 do b:call(function() return nil, "down" end) end
                ngx.say(b:state())
            }
        }
        location /state {
            content_by_lua_block {
                local b = require("fuse").get(ngx.var.arg_name)
                ngx.say(b and (b:state() .. " " .. b.cfg.fails) or "missing")
            }
        }
        location /info {
            content_by_lua_block {
                local B = require "fuse.ffi"
                ngx.say(B.capacity(), " ", B.live(), " ", ngx.shared.stats:get("unguarded") or 0)
            }
        }
    }
    lua_shared_dict stats 1m;
}
EOF
  chmod a+r "$P/nginx.conf"
}

get() { curl -s -m 10 "http://127.0.0.1:$PORT$1"; }
worker_pids() { workers | sort; }
rss_kb() { local s=0 r; for p in $(worker_pids); do r=$(awk '/^VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null); s=$((s + ${r:-0})); done; echo "$s"; }

first_conf() { conf 1000 2; }
start_rendered 1 first_conf "$P" || bail "nginx did not start: $NGINX_START_ERR"
for _ in $(seq 50); do [ -r "$P/logs/nginx.pid" ] && break; sleep 0.1; done
MASTER=$(cat "$P/logs/nginx.pid")
for _ in $(seq 50); do [ "$(get /info | wc -w)" = 3 ] && break; sleep 0.1; done

tripped=0
for i in $(seq 10); do [ "$(get "/trip?name=trip-$i")" = open ] && tripped=$((tripped + 1)); done
check "ten breakers tripped before the flood" [ "$tripped" = 10 ]

# wrk: each thread walks names of its own (a prefix per run); every 50th request fails,
# so breakers trip. Runs of 1 s until NAMES requests (each a new name) were made; the
# workers' RSS once half of the names went through is the baseline (Lua's heap and
# the caches of recent names have grown to their size by then).
cat > "$T/names.lua" <<'EOF'
local counter = 0
function setup(thread) counter = counter + 1; thread:set("id", counter) end
function init(args) n = 0; prefix = "/k?name=" .. args[1] .. "-" .. id .. "-" end
function request()
  n = n + 1
  return wrk.format(nil, prefix .. n .. (n % 50 == 0 and "&fail=1" or ""))
end
function done(summary)
  io.write(string.format("requests %d non2xx %d errors %d\n", summary.requests, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
EOF
total=0 non2xx=0 errs=0 run=0 rss0= rsslog=
start=$(date +%s)
while [ "$total" -lt "$NAMES" ] && [ $(( $(date +%s) - start )) -lt 90 ]; do
  run=$((run + 1))
  wrk -t2 -c8 -d1s -s "$T/names.lua" "http://127.0.0.1:$PORT/k" --timeout 5s -- "r$run" > "$T/wrk.out" 2>&1
  read -r _ r _ x _ e < <(grep '^requests' "$T/wrk.out")
  total=$((total + ${r:-0})) non2xx=$((non2xx + ${x:-1})) errs=$((errs + ${e:-1}))
  rsslog="$rsslog $(rss_kb)"
  [ -z "$rss0" ] && [ "$total" -ge $((NAMES / 2)) ] && rss0=$(rss_kb)
done
secs=$(( $(date +%s) - start ))
rss1=$(rss_kb)
rss0=${rss0:-$rss1}
diag "flood: $total requests, each a new name, in ${secs}s ($run runs), non-2xx $non2xx, socket errors $errs"
check "$NAMES distinct names fed, every request answered 200" \
  test "$total" -ge "$NAMES" -a "$non2xx" = 0 -a "$errs" = 0
info=$(get /info)
diag "capacity, live breakers, requests answered unguarded (registry full): $info"
still=0
for i in $(seq 10); do [ "$(get "/state?name=trip-$i")" = "open 2" ] && still=$((still + 1)); done
check "the ten tripped breakers are still open after the flood" [ "$still" = 10 ]
diag "workers' RSS: ${rss0} kB after half of the names, ${rss1} kB after the flood (after each run:$rsslog kB)"
# a leak of even one Lua object per name would add ~150 MB over 100,000 names
check "workers' RSS flat after the warm-up (grew < 32 MB in all, GC included)" [ $((rss1 - rss0)) -lt 32768 ]
errors=$(grep -E '\[(error|crit|alert|emerg)\]' "$P/logs/error.log" | head -n 3)
check "no error in the log" [ -z "$errors" ]
[ -n "$errors" ] && diag "$errors"

# Reload: capacity 2000, fails 5 for the tripped breakers.
old=$(worker_pids | tr '\n' ' ')
conf 2000 5
kill -HUP "$MASTER"
# shellcheck disable=SC2086  # one pid a word
reloaded 60 $old || diag "old workers still alive 60 s after the reload: $old"
check "after a reload with capacity 2000, the new workers' registry has capacity 2000" \
  [ "$(get /info | cut -d' ' -f1)" = 2000 ]
still=0
for i in $(seq 10); do [ "$(get "/state?name=trip-$i")" = "open 5" ] && still=$((still + 1)); done
check "the tripped breakers are still open there, with their new options (fails 5)" [ "$still" = 10 ]
check "a notice in the log for each reconfigured breaker" \
  [ "$(grep -c "fuse: breaker 'trip-[0-9]*' reconfigured (old vs new): fails (2 vs 5)" "$P/logs/error.log")" -ge 10 ]
check "a new name after the reload works" [ "$(get "/k?name=after-reload")" = up ]
errors=$(grep -E '\[(error|crit|alert|emerg)\]' "$P/logs/error.log" | head -n 3)
check "no error in the log after the reload" [ -z "$errors" ]
[ -n "$errors" ] && diag "$errors"

echo "1..$n"
[ "$failed" = 0 ]
