#!/usr/bin/env bash
# bench/nginx_upstream_traces.sh [LUA_DIR] -- not a bench: which LuaJIT traces the
# healthy static pool of bench/upstream_fronts.sh runs on, with (HISTORY=1) or without
# failures served first by the same front. One nginx front (`master_process off`, no
# valgrind) whose init_by_lua attaches `jit.attach` handlers: trace starts (where, and
# of which trace and exit a side trace is) and exits to the interpreter (per trace and
# exit). HISTORY=1: HISTORY_S (10) s of the history of bench/nginx_upstream_instr.sh
# (pools sick and dead). Then 3 s of `wrk -t1 -c4` on the static pool (the warm-up:
# traces compiled, exits), and 3 s more (the requests, exits): the 15 busiest exits,
# each with the line its trace starts at. See bench/README.md, "the healthy path after
# failures".
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/test/lib/nginx.sh"
. "$ROOT/bench/upstream_fronts.sh"
NGINX=$(nginx_bin)
LUA=${1:-$ROOT/lua}
HISTORY=${HISTORY:-0}
T=$(mktemp -d /tmp/fuse-bench-traces.XXXXXX) || exit 1
PIDS=()
VP=
trap '[ -n "$VP" ] && stop_pid "$VP" TERM; cleanup_nginx "${PIDS[@]}"' EXIT
trap 'exit 1' INT TERM HUP
copy_fuse "$T" "$LUA"
mkdir -p "$T/logs" "$T/temp"
BASE=$(pick_ports 12) || { echo "no 12 free ports in a row" >&2; exit 1; }
S1=$((BASE + 1)) S2=$((BASE + 2)) S3=$((BASE + 3)) FS=$((BASE + 4)) LS=$((BASE + 5)) RS=$((BASE + 6))
GS=$((BASE + 7)) H5=$((BASE + 8)) HR=$((BASE + 9)) HS=$((BASE + 10)) HD=$((BASE + 11))
static_peers_conf > "$T/peers.conf"
history_peers_conf "$T/peers.conf"
FRONT_INIT="$(history_init)
        local ex, start, n, nt, sides = {}, {}, 0, 0, 0
        local fi = require(\"jit.util\").funcinfo
        -- (both handlers interpreted, jit.off: a handler that runs compiled code while a trace is recorded can crash LuaJIT)
        local on_trace = function(what, tr, func, pc, otr, oex) if what == \"stop\" then nt = nt + 1; if start[tr] and start[tr]:find(\"side\") then sides = sides + 1 end end if what == \"start\" then local i = fi(func, pc); start[tr] = (i.loc or \"?\") .. (otr and (\" side of \" .. otr .. \"/\" .. oex) or \"\") end end
        local on_exit = function(tr, ex_, ...) n = n + 1; local k = tr .. \"/\" .. ex_; ex[k] = (ex[k] or 0) + 1 end
        jit.off(on_trace, true); jit.off(on_exit, true)
        jit.attach(on_trace, \"trace\"); jit.attach(on_exit, \"texit\")
        package.loaded.diag = { zero = function() ex = {}; n = 0; nt = 0; sides = 0 end, show = function()
          local ks = {} for k in pairs(ex) do ks[#ks + 1] = k end
          table.sort(ks, function(a, b) return ex[a] > ex[b] end)
          local out = { \"exits \" .. n .. \" traces compiled \" .. nt .. \" of which side \" .. sides }
          for i = 1, math.min(#ks, 15) do local tr = tonumber(ks[i]:match(\"^%d+\")); out[#out + 1] = ks[i] .. \" \" .. ex[ks[i]] .. \" \" .. tostring(start[tr]) end
          return table.concat(out, \"\\n\") end }"
cat > "$T/front.conf" <<EOF
$(single_front_head)
$(history_front)
    server { listen 127.0.0.1:$GS;
        location = /zero { content_by_lua_block { require("diag").zero() } }
        location = /show { content_by_lua_block { ngx.say(require("diag").show()) } }
    }
}
EOF
"$NGINX" -p "$T/" -c peers.conf || exit 1
PIDS+=("$(cat "$T/logs/peers.pid")")
"$NGINX" -p "$T/" -c front.conf > "$T/front.out" 2>&1 &
VP=$!
wait_for 30 curl -s -m 1 -o /dev/null "http://127.0.0.1:$FS/" || { cat "$T/front.out" "$T/logs/front.err"; exit 1; }
if [ "$HISTORY" = 1 ]; then
  run_history "${HISTORY_S:-10}" "$T/history"
  grep "requests in" "$T/history.sick"
fi
curl -s "http://127.0.0.1:$GS/zero"
wrk -t1 -c4 -d3s "http://127.0.0.1:$FS/" > /dev/null
echo "the warm-up (3 s):"; curl -s "http://127.0.0.1:$GS/show"
curl -s "http://127.0.0.1:$GS/zero"
wrk -t1 -c4 -d3s "http://127.0.0.1:$FS/" | grep "requests in"
curl -s "http://127.0.0.1:$GS/show"
stop_pid "$VP" TERM; wait "$VP" 2>/dev/null; VP=
