#!/usr/bin/env bash
# bench/nginx_jit_pool.sh [seconds] [lua_dir] -- which functions of fuse LuaJIT has
# blacklisted in each nginx worker after SECONDS (60) of wrk traffic through a
# fuse.upstream pool of two peers, one of them refusing connections (its breaker open
# most of the time); HEALTHY=1: both peers answer; PEERS=n DOWN=k: n peers (2), the last k
# (1) refusing. Not a make target; a diagnostic.
#
# A blacklisted entry or loop (IFUNCF, IFORL, ILOOP, ...) runs interpreted for the
# worker's life, and every trace through it aborts. Found 2026-12-04 (branch jit): with
# one peer of two down, pick_from, pick and Pool:balance (upstream.lua:888, 1012, 1473)
# were blacklisted in both workers within 60 s; with both peers healthy, none (only
# resync, jit.off by design). The cause: the per-peer loops of pick and pick_from run
# two times when a pool has two peers, and LuaJIT cannot start a root trace at a loop
# that runs fewer than three times ("leaving loop in root trace"); run interpreted often
# enough, such a loop is blacklisted, and then every trace through it aborts. Fixed
# 2026-12-04 (branch loops): for two peers, the pick that goes on from a rejected peer
# has no loop; none blacklisted in 2 x 60 s (resync aside), none with PEERS=3 DOWN=1|2.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
NGINX=$(nginx_bin)
SECS=${1:-60}; TREE=${2:-$ROOT/lua}
command -v "$NGINX" >/dev/null || { echo "nginx not installed" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk not installed" >&2; exit 1; }
T=$(mktemp -d /tmp/fuse-jit-pool.XXXXXX); P=$T/prefix
mkdir -p "$P/logs" "$P/temp"
copy_fuse "$T" "$TREE"
# PEERS=n (2) peers, the last DOWN=k (1) of them refusing connections (none with HEALTHY=1)
NPEERS=${PEERS:-2}; NDOWN=${DOWN:-1}
[ -n "${HEALTHY:-}" ] && NDOWN=0
[ "$NDOWN" -lt "$NPEERS" ] || { echo "DOWN=$NDOWN: at least one of the PEERS=$NPEERS peers must answer" >&2; exit 1; }
PORT=$(pick_ports $((NPEERS + 1))) || exit 1
LIST=""; EXTRA=""
for ((i = 1; i <= NPEERS; i++)); do
  LIST="$LIST\"127.0.0.1:$((PORT + i))\", "
  [ "$i" -le $((NPEERS - NDOWN)) ] && EXTRA="$EXTRA    server { listen 127.0.0.1:$((PORT + i)); location / { return 200 \"ok\\n\"; } }
"
done
cat > "$P/nginx.conf" <<CONF
$(bench_conf_head "$T")
    lua_shared_dict fuse_upstream 1m;
    init_by_lua_block {
        local fuse = require "fuse"
        fuse.init{ shared = true, capacity = 64 }
        package.loaded.backend = require("fuse.upstream").new("backend", { $LIST},
            { fails = 3, window = 10, open_for = 5 })
    }
    upstream backend {
        server 0.0.0.1;
        balancer_by_lua_block { require("backend"):balance() }
        keepalive 32;
    }
$EXTRA
    server {
        listen 127.0.0.1:$PORT;
        add_header X-Worker-Pid \$pid always;
        log_by_lua_block { require("fuse.upstream").log() }
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_next_upstream error timeout http_500 http_502 http_503 http_504;
            proxy_connect_timeout 1s;
        }
        location = /scan {
            content_by_lua_block {
                local jutil, vmdef = require "jit.util", require "jit.vmdef"
                local seen, bad, nf = {}, {}, 0
                local BL = { IFUNCF = true, IFUNCV = true, IFORL = true, IITERL = true, ILOOP = true }
                local function visit(v)
                    local tv = type(v)
                    if (tv ~= "table" and tv ~= "function" and tv ~= "proto") or seen[v] then return end
                    seen[v] = true
                    if tv == "table" then for k, x in next, v do visit(k); visit(x) end; visit(debug.getmetatable(v)); return end
                    local info = jutil.funcinfo(v)
                    if not info.source then return end
                    if tv == "function" then
                        for i = 1, info.upvalues do local _, u = debug.getupvalue(v, i); visit(u) end
                        visit(info.proto); return
                    end
                    nf = nf + 1
                    for pc = 0, info.bytecodes - 1 do
                        local ins = jutil.funcbc(v, pc)
                        local op = ins and vmdef.bcnames:sub((ins % 256) * 6 + 1, (ins % 256) * 6 + 6):gsub(" +\$", "")
                        if op and BL[op] then bad[#bad + 1] = info.loc .. " " .. op .. "@" .. pc end
                    end
                    for i = 1, info.gcconsts do visit(jutil.funck(v, -i)) end
                end
                for name, mod in pairs(package.loaded) do if name:find("fuse") or name:find("backend") then visit(mod) end end
                ngx.say(nf, " protos; blacklisted: ", table.concat(bad, "; "))
            }
        }
    }
}
CONF
"$NGINX" -p "$P/" -c nginx.conf || exit 1
trap 'cleanup_nginx "$(cat "$P/logs/nginx.pid")"; rm -rf "$T"' EXIT
wait_for 10 curl -s -o /dev/null "http://127.0.0.1:$PORT/scan" || { echo "nginx did not answer" >&2; exit 1; }
wrk -t2 -c16 -d"${SECS}s" "http://127.0.0.1:$PORT/" | grep -E "Requests/sec|Non-2xx"
for _ in $(seq 20); do curl -s -m 5 -H 'Connection: close' -w ' pid %header{x-worker-pid}\n' "http://127.0.0.1:$PORT/scan"; done | sort -u
