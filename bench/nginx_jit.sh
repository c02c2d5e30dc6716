#!/usr/bin/env bash
# bench/nginx_jit.sh -- the guarded call's hot-loop cost inside a real nginx worker, fresh
# and after sustained traffic (`make bench-nginx-jit`).
#
# A worker that has served traffic for a while has run its request handlers, and the
# guarded calls in them, from interpreted code many times. LuaJIT must not have
# blacklisted any function of fuse meanwhile: the hot loop over a guarded call should
# cost the same after the traffic as before (target: within 20%).
#
# Starts nginx (2 workers, temp prefix, free port), asks each worker for the cost of
# loops of guarded calls (GET /hot: a new loop each time, timed with CLOCK_MONOTONIC,
# the least of 7 runs of 1e6 calls), sends wrk traffic to /traffic (handlers that make
# closed, rejected and two-step guarded calls) for SECONDS (default 10), asks again,
# stops nginx by its pid. Prints one line per worker and case.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
NGINX=$(nginx_bin)
SECONDS_OF_TRAFFIC=${1:-${SECONDS_OF_TRAFFIC:-10}}
command -v "$NGINX" >/dev/null || { echo "nginx not installed" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk not installed" >&2; exit 1; }
[ -r "$ROOT/build/fuse/core.so" ] || { echo "build/fuse/core.so missing: run make" >&2; exit 1; }

T=$(mktemp -d /tmp/fuse-nginx-jit.XXXXXX)
P=$T/prefix
trap 'cleanup_nginx "$(cat "$P/logs/nginx.pid" 2>/dev/null)"' EXIT
mkdir -p "$P/logs" "$P/temp"
copy_fuse "$T"

PORT=$(pick_ports 1) || { echo "no free port" >&2; exit 1; }

cat > "$P/nginx.conf" <<EOF
$(bench_conf_head "$T")
    init_by_lua_block {
        local fuse = require "fuse"
        local ffi = require "ffi"
        ffi.cdef [[
          typedef struct { long tv_sec; long tv_nsec; } njit_timespec;
          int njit_clock_gettime(int clk, njit_timespec *tp) __asm__("clock_gettime");
        ]]
        local ts = ffi.new("njit_timespec")
        local function now()
            ffi.C.njit_clock_gettime(1, ts)
            return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
        end
        local function tiny(x) return x + 1 end
        local failing = false
        local function flaky(x) if failing then return nil, "down" end return x + 1 end
        local app = {}
        app.closed = fuse.wrap(tiny, { fails = 5, window = 10 })
        app.rejected, app.open_b = fuse.wrap(flaky, { fails = 5, window = 10, open_for = 86400 })
        failing = true
        for _ = 1, 5 do app.rejected(0) end
        failing = false
        app.twostep = fuse.new { fails = 5, window = 10 }
        local BODIES = {
            closed = "s = s + g(i)",
            rejected = "local r, rej = g(i) if r == nil and rej then s = s + 1 end",
            twostep = "local t = g:allow() g:report(t, true) s = s + 1",
        }
        -- the least ns per call of a new loop over app[name], in 7 runs of n calls (the
        -- least: other work on the machine only ever adds)
        function app.measure(name, n)
            local loop = assert(load(("local g = ... return function(n) local s = 0 for i = 1, n do %s end return s end")
                :format(BODIES[name]), "=hot<" .. name .. ">"))(app[name])
            loop(1000)
            local runs = {}
            for r = 1, 7 do
                local t0 = now()
                loop(n)
                runs[r] = (now() - t0) / n * 1e9
            end
            table.sort(runs)
            return runs[1]
        end
        package.loaded.njit_app = app
    }
    server {
        listen 127.0.0.1:$PORT;
        location = /hot {
            content_by_lua_block {
                local app = require "njit_app"
                local out = {}
                for _, name in ipairs { "closed", "rejected", "twostep" } do
                    out[#out + 1] = ("%s %.2f"):format(name, app.measure(name, 1000000))
                end
                ngx.say(ngx.worker.pid(), " ", table.concat(out, " "))
            }
        }
        location = /traffic {
            content_by_lua_block {
                local app = require "njit_app"
                local n = tonumber(ngx.var.arg_n) or 1
                local s = app.closed(n)
                local r, rej = app.rejected(n)
                local t = app.twostep:allow()
                app.twostep:report(t, true)
                ngx.say(s, " ", r == nil and rej ~= nil)
            }
        }
    }
}
EOF
chmod -R a+rX "$T"
"$NGINX" -p "$P/" -c nginx.conf || { cat "$P/logs/error.log"; exit 1; }
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$PORT/traffic" && break; sleep 0.1; done

# one /hot answer per worker (requests land on either worker: ask until both answered)
hot() {
  local seen="" line pid
  for _ in $(seq 40); do
    line=$(curl -s -m 30 -H 'Connection: close' "http://127.0.0.1:$PORT/hot")
    pid=${line%% *}
    case " $seen " in *" $pid "*) continue ;; esac
    seen="$seen $pid"
    echo "$line"
    [ "$(echo "$seen" | wc -w)" -ge 2 ] && break
  done
}

echo "fuse in nginx ($("$NGINX" -v 2>&1 | sed 's/.*: //'), 2 workers): ns per guarded call in a hot loop"
hot | sort > "$T/fresh"
wrk -t2 -c16 -d"${SECONDS_OF_TRAFFIC}s" "http://127.0.0.1:$PORT/traffic" > "$T/wrk.out" 2>&1
reqs=$(sed -n 's/^Requests\/sec: *//p' "$T/wrk.out")
hot | sort > "$T/after"
printf '%-8s %-10s %10s %12s %8s\n' worker case fresh after ratio
join "$T/fresh" "$T/after" | awk '{
  for (k = 0; k < 3; k++)
    printf "%-8s %-10s %10s %12s %8.2f\n", $1, $(2 + 2 * k), $(3 + 2 * k), $(9 + 2 * k), $(9 + 2 * k) / $(3 + 2 * k)
}'
echo "traffic: ${SECONDS_OF_TRAFFIC} s of wrk -t2 -c16 on /traffic, ${reqs:-?} requests/s"
errs=$(grep -cE '\[(error|alert|crit|emerg)\]' "$P/logs/error.log")
[ "$errs" -eq 0 ] || { echo "errors in the error log:"; grep -E '\[(error|alert|crit|emerg)\]' "$P/logs/error.log" | head; exit 1; }
