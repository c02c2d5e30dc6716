#!/usr/bin/env bash
# test/reload.t.sh -- `nginx -s reload` as operators do it, under traffic (prints TAP).
#
# One nginx, 4 workers: a front on PORT whose pool "p" (fuse.upstream, made in
# init_by_lua) balances over peers served by the same nginx on PORT+1 (A), PORT+2 (B) and
# PORT+3 (C), each answering its own letter; /metrics; /peers (the pool's list as this
# worker sees it, with its pid). A load loop of curl runs through each reload.
#   1. a reload that fails after the pool's upstream.new succeeded (the config drops B
#      from p's list, then another pool's upstream.new raises on a bad peer): nginx keeps
#      the old workers, and they must keep p's list (A B) and B's breaker. The check waits
#      for the failed reload's [emerg]/[error] line in the error log, then for each of
#      the 4 old workers' answers.
#   2. the same change in a reload that succeeds, with requests on B in flight in the old
#      workers (B answers them 500 after 3 s): once every old worker has exited, all 4
#      new workers pick over A C only, B's breaker and counters are gone from /metrics
#      (the old workers' late log phases brought nothing back) and no request of the load
#      loop failed.
#   3. a reload with capacity 128 that fails, a breaker k tripped in the old workers, then
#      a reload with capacity 128 that succeeds: every new worker sees k open.
#   4. a reload that fails after reconfiguring breaker k2 (fails 3 -> 1): the old workers
#      keep fails = 3; then a reload with fails = 5 that succeeds: its notice is logged,
#      k2 keeps its count and trips at 5.
# Needs nginx with the Lua module, lua-resty-core and curl. KEEP=1 keeps the temp prefix.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
# shellcheck source=test/lib/tap.sh
. "$ROOT/test/lib/tap.sh"   # ok, nok, diag, check, bail, skip, skip_all
nginx_suite reload resty-core curl
P=$T/prefix
MASTER=
LOAD=
trap '[ -n "$LOAD" ] && kill "$LOAD" 2>/dev/null; cleanup_nginx "$MASTER"' EXIT
watchdog 300
mkdir -p "$P/logs" "$P/temp"
copy_fuse "$T" "$LUA_SRC" "$SO_SRC"

# conf LIST EXTRA [CAPACITY [FAILS]]: the config; LIST is p's peer list (Lua), EXTRA more
# Lua at the end of init_by_lua (a reload that fails puts a bad pool there), CAPACITY the
# registry's (64), FAILS breaker k2's fails (3).
conf() {
  cat > "$P/nginx.conf" <<EOF
user nobody nogroup;
$(nginx_conf_head "$T" 4 notice 1024)
    lua_shared_dict fuse_upstream 1m;
    lua_shared_dict flags 1m;
    init_by_lua_block {
        local fuse = require "fuse"
        fuse.init{ shared = true, capacity = ${3:-64} }
        fuse.new{ name = "k", fails = 1, window = 60, open_for = 3600 }
        fuse.new{ name = "k2", fails = ${4:-3}, window = 60, open_for = 3600 }
        local A, B, C = "127.0.0.1:$((PORT + 1))", "127.0.0.1:$((PORT + 2))", "127.0.0.1:$((PORT + 3))"
        package.loaded.pool_p = require("fuse.upstream").new("p", $1, { fails = 3, window = 10, open_for = 60 })
        $2
    }
    upstream p_up {
        server 0.0.0.1;
        balancer_by_lua_block { require("pool_p"):balance() }
    }
    server {
        listen 127.0.0.1:$PORT;
        log_by_lua_block { require("fuse.upstream").log() }
        location / { proxy_pass http://p_up; }
        location = /slow { proxy_pass http://p_up; proxy_read_timeout 30s; }
        location = /inflight { content_by_lua_block { ngx.say(ngx.shared.flags:get("slow") or 0) } }
        location = /trip {
            content_by_lua_block {
                local k = require("fuse").get(ngx.var.arg_name or "k")
                pcall(k.call, k, function() error("down") end)
                ngx.say(ngx.worker.pid(), " ", k:state())
            }
        }
        location = /k {
            content_by_lua_block {
                local fuse = require "fuse"
                ngx.say(ngx.worker.pid(), " ", fuse.get("k"):state())
            }
        }
        location = /metrics { content_by_lua_block { require("fuse").metrics_chunks(ngx.print) } }
        location = /peers {
            content_by_lua_block {
                local t = {}
                for _, q in ipairs(require("pool_p"):peers()) do t[#t + 1] = q.addr:match(":(%d+)$") end
                ngx.say(ngx.worker.pid(), " ", table.concat(t, ","))
            }
        }
    }
    server {
        listen 127.0.0.1:$((PORT + 1));
        listen 127.0.0.1:$((PORT + 2));
        listen 127.0.0.1:$((PORT + 3));
        location / { return 200 "\$server_port\n"; }
        # B answers 500 after 3 s (counted as the try's failure by the pool's log phase)
        location = /slow {
            content_by_lua_block {
                if ngx.var.server_port ~= "$((PORT + 2))" then return ngx.say(ngx.var.server_port) end
                ngx.shared.flags:incr("slow", 1, 0)
                ngx.sleep(3)
                ngx.exit(500)
            }
        }
    }
}
EOF
  chmod a+r "$P/nginx.conf"
}
render_ab() { conf '{ A, B }' ''; }
start_once() { render_ab && : > "$P/logs/error.log" && nginx_start "$P" nginx.conf; }
start_on_free_ports 4 start_once "$P/logs/error.log" || bail "nginx did not start: $NGINX_START_ERR"
MASTER=$(cat "$P/logs/nginx.pid")
A=$((PORT + 1)) B=$((PORT + 2)) C=$((PORT + 3))
get() { curl -s -m 5 "http://127.0.0.1:$PORT$1"; }
wait_for 30 get /peers > /dev/null || bail "nginx does not answer"

# all_say PATH WANT: every one of the master's current workers answered PATH ("PID VALUE")
# with WANT (polled until 4 distinct pids of the master's workers answered, each with its
# value); SEEN: the pids seen, and the first other value with its pid.
all_say() {
  local path=$1 want=$2 seen="" line pid val ws i
  ws=" $(workers | tr '\n' ' ')"
  for ((i = 0; i < 400; i++)); do
    line=$(get "$path") || continue
    pid=${line%% *} val=${line#* }
    case "$ws" in *" $pid "*) ;; *) continue ;; esac
    case " $seen " in *" $pid "*) continue ;; esac
    [ "$val" = "$want" ] || { SEEN="$seen $pid:$val"; return 1; }
    seen="$seen $pid"
    [ "$(wc -w <<< "$seen")" -ge 4 ] && { SEEN=$seen; return 0; }
  done
  SEEN="$seen (fewer than 4 workers answered)"
  return 1
}
# peers_of_all LIST: every worker picks over LIST (/peers: the ports, joined by ",")
peers_of_all() { all_say /peers "$1"; }
breaker_of() { get /metrics | grep -c "name=\"p/127.0.0.1:$1\""; }

# load: curl / in a loop until $T/stop exists, one answer (or the error code) a line
start_load() {
  rm -f "$T/stop"
  ( while [ ! -e "$T/stop" ]; do
      curl -s -m 5 -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:$PORT/" || echo "curl-$?"
    done > "$T/load.$1" ) &
  LOAD=$!
}
stop_load() { touch "$T/stop"; wait "$LOAD" 2>/dev/null; LOAD=; }

check "before any reload every worker picks over A B ($(peers_of_all "$A,$B"; echo "$SEEN"))" \
  peers_of_all "$A,$B"
for _ in 1 2 3 4 5 6; do get / > /dev/null; done
check "B's breaker shows in /metrics before the reload" [ "$(breaker_of $B)" -gt 0 ]

# ---------------------------------------------------------------- 1. a reload that fails
old=$(workers | sort | tr '\n' ' ')
start_load failed
conf '{ A, C }' 'require("fuse.upstream").new("q", { "nope" })'
kill -HUP "$MASTER"
failed_logged() { grep -q 'peer 1: .*"nope"' "$P/logs/error.log"; }
wait_for 60 failed_logged
check "the reload with a bad pool q fails, logged ($(grep -m1 -o 'init_by_lua error.*' "$P/logs/error.log" | head -c 160))" \
  failed_logged
now=$(workers | sort | tr '\n' ' ')
check "nginx kept the old workers ($old; now: $now)" [ "$old" = "$now" ]
for _ in $(seq 20); do get / > /dev/null; done   # each worker syncs its pool
check "after the failed reload every old worker still picks over A B ($(peers_of_all "$A,$B"; echo "$SEEN"))" \
  peers_of_all "$A,$B"
check "B's breaker is still in /metrics after the failed reload ($(breaker_of $B) lines)" [ "$(breaker_of $B)" -gt 0 ]
stop_load
bad=$(grep -vc '^200$' "$T/load.failed")
check "the load loop got only 200s through the failed reload ($(grep -c '^200$' "$T/load.failed") 200s, $bad others)" \
  [ "$bad" -eq 0 ]

# ---------------------------------------------------------------- 2. the same change, a reload that succeeds
# With requests on B in flight in the old workers: they end (500, a failure of B) after
# the new workers stored the list without B; what their log phase counts must not bring
# B's breaker or counters back.
old=$(workers | sort | tr '\n' ' ')
: > "$T/slow"
SLOW=()
for _ in 1 2 3 4 5 6 7 8; do
  curl -s -m 20 -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:$PORT/slow" >> "$T/slow" &
  SLOW+=("$!")
done
inflight() { [ "$(get /inflight)" -ge 1 ] 2>/dev/null; }
check "requests on B in flight before the reload ($(get /inflight))" wait_for 20 inflight
start_load ok
conf '{ A, C }' ''
kill -HUP "$MASTER"
# shellcheck disable=SC2086  # the pids, one word each
check "the old workers exited after the reload ($old)" reloaded 120 $old
check "after the reload every new worker picks over A C ($(peers_of_all "$A,$C"; echo "$SEEN"))" \
  peers_of_all "$A,$C"
stop_load
wait "${SLOW[@]}"
slow=$(sort "$T/slow" | uniq -c | tr -s ' \n' ' ')
check "the requests on B ended in the old workers, B's 500s among them ($slow)" grep -q '^500$' "$T/slow"
for _ in $(seq 20); do get / > /dev/null; done
check "B's breaker and counters are gone from /metrics ($(breaker_of $B) lines)" [ "$(breaker_of $B)" -eq 0 ]
bad=$(grep -vc '^200$' "$T/load.ok")
check "the load loop got only 200s through the reload ($(grep -c '^200$' "$T/load.ok") 200s, $bad others: $(grep -v '^200$' "$T/load.ok" | sort | uniq -c | tr '\n' ' '))" \
  [ "$bad" -eq 0 ]
# ---------------------------------------------------------------- 3. capacity: a reload that fails, then one that succeeds
# A reload that changes the registry's capacity maps a new registry in the master and
# copies the breakers into it (docs/reloads.md); when nginx then fails the reload, the old
# workers go on in the old registry. The next reload must start from that one, not from
# the copy the failed reload made (which misses everything since).
# errors_logged N: nginx logged its Nth "init_by_lua error" (a reload that failed)
errors_logged() { [ "$(grep -c 'init_by_lua error' "$P/logs/error.log")" -ge "$1" ]; }
# reload_fails N WHAT: sends the reload of the conf written last, which must fail: waits
# for the Nth "init_by_lua error", checks it and that nginx kept the workers ($old)
reload_fails() {
  old=$(workers | sort | tr '\n' ' ')
  kill -HUP "$MASTER"
  wait_for 60 errors_logged "$1"
  check "the reload with $2 fails, logged" errors_logged "$1"
  now=$(workers | sort | tr '\n' ' ')
  check "nginx kept the old workers ($old; now: $now)" [ "$old" = "$now" ]
}
conf '{ A, C }' 'require("fuse.upstream").new("q", { "nope" })' 128
reload_fails 2 "capacity 128 and a bad pool q"
# k_all STATE: each of the master's 4 workers answers /k with STATE
k_all() { all_say /k "$1"; }
tripped=$(get /trip)
check "an old worker trips k after the failed reload ($tripped)" [ "${tripped#* }" = open ]
check "every old worker sees k open ($(k_all open; echo "$SEEN"))" k_all open
old=$(workers | sort | tr '\n' ' ')
conf '{ A, C }' '' 128
kill -HUP "$MASTER"
# shellcheck disable=SC2086  # the pids, one word each
check "the old workers exited after the reload with capacity 128 ($old)" reloaded 120 $old
check "every new worker sees k open, as the old workers left it ($(k_all open; echo "$SEEN"))" k_all open

# ---------------------------------------------------------------- 4. options: a reload that fails, then one that succeeds
# fuse.new in init_by_lua of an existing name with other options reconfigures the shared
# breaker (docs/reloads.md); a reload that fails after it must leave the old workers with
# their options.
conf '{ A, C }' 'require("fuse.upstream").new("q", { "nope" })' 128 1
reload_fails 3 "k2's fails = 1 and a bad pool q"
tripped=$(get "/trip?name=k2")
check "after the failed reload k2 keeps fails = 3: one failure leaves it closed ($tripped)" [ "${tripped#* }" = closed ]
conf '{ A, C }' '' 128 5
kill -HUP "$MASTER"
# shellcheck disable=SC2086  # the pids, one word each
check "the old workers exited after the reload with k2's fails = 5 ($old)" reloaded 120 $old
check "the reload logged k2's new options: $(grep -o "fuse: breaker 'k2' reconfigured.*" "$P/logs/error.log" | tail -1)" \
  grep -q "fuse: breaker 'k2' reconfigured (old vs new): fails (3 vs 5)" "$P/logs/error.log"
for _ in 2 3 4; do tripped=$(get "/trip?name=k2"); done
check "k2 kept its failure across the reload and has fails = 5: 3 more leave it closed ($tripped)" [ "${tripped#* }" = closed ]
tripped=$(get "/trip?name=k2")
check "and the 5th opens it ($tripped)" [ "${tripped#* }" = open ]

log_clean "$P/logs/error.log" "no other error in the log" '\[(error|crit|alert|emerg)\]' '"nope"'

echo "1..$n"
[ "$failed" -eq 0 ]
