#!/usr/bin/env bash
# test/exits.t.sh -- guarded functions that end the request (ngx.exit, ngx.exec,
# ngx.redirect) are counted by fuse.settle() in the log phase (prints TAP).
#
# Such a function never returns to its guard (the exit yields out of the request's
# coroutine, and nginx never resumes it). With `log_by_lua_block { require("fuse").settle() }`
# the call counts by the response status; without it, it counts as ignored and a warning
# says so. Starts nginx with 4 workers and a shared registry in a temp prefix, talks to
# it over 127.0.0.1 on free ports, stops it by its pid; a watchdog stops it after 90 s.
# KEEP=1 keeps the temp prefix. FUSE_LUA_DIR / FUSE_CORE_SO try another tree.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
# shellcheck source=test/lib/tap.sh
. "$ROOT/test/lib/tap.sh"   # ok, nok, diag, check, bail, skip, skip_all
nginx_suite exits curl

# ---------------------------------------------------------------- setup
P=$T/prefix
MASTER=
trap 'cleanup_nginx "${MASTER:-$(cat "$P/logs/nginx.pid" 2>/dev/null)}"' EXIT
watchdog 90

mkdir -p "$P/logs" "$P/temp"
copy_fuse "$T" "$LUA_SRC" "$SO_SRC"

# Two servers share one http block. The first has the hook (at http level, inherited);
# the second overrides it with a log phase of its own that forgets fuse.settle(), as a
# location with its own log_by_lua* does.
write_conf() {
  PORT2=$((PORT + 1))
  cat > "$P/nginx.conf" <<EOF
$(nginx_conf_head "$T" 4 warn 256)
    init_by_lua_block {
        local fuse = require "fuse"
        fuse.init{ shared = true, capacity = 64 }
        local app = {}
        for _, name in ipairs { "exit", "probe", "reprobe", "exec", "redirect", "plain", "nohook" } do
            app[name] = fuse.new{ name = name, fails = 3, window = 60, open_for = 1 }
        end
        -- the guarded function of every location: it ends the request as told
        app.ending = function(how, status)
            if how == "exit" then
                ngx.status = status
                ngx.say("ended with ", status)
                return ngx.exit(status)
            elseif how == "exec" then
                return ngx.exec("/target", "status=" .. status)
            elseif how == "redirect" then
                return ngx.redirect("/elsewhere")
            end
            return status   -- returns normally
        end
        package.loaded.exits_app = app
    }
    log_by_lua_block { require("fuse").settle() }

    server {
        listen 127.0.0.1:$PORT;
        location /call {   # /call?b=NAME&how=exit|exec|redirect|return&status=N
            content_by_lua_block {
                local app = require "exits_app"
                local status = tonumber(ngx.var.arg_status) or 200
                local res, rej = app[ngx.var.arg_b]:call(app.ending, ngx.var.arg_how, status)
                if res == nil and rej then return ngx.exit(503) end
                ngx.say("returned ", res)
            }
        }
        location = /target {
            content_by_lua_block { ngx.exit(tonumber(ngx.var.arg_status)) }
        }
        location = /state {   # NAME STATE SUCCESSES FAILURES REJECTIONS
            content_by_lua_block {
                local s = require("exits_app")[ngx.var.arg_b]:stats()
                ngx.say(ngx.var.arg_b, " ", s.state, " ", s.successes_total, " ",
                        s.failures_total, " ", s.rejections_total)
            }
        }
    }
    server {
        listen 127.0.0.1:$PORT2;
        log_by_lua_block { local _ = ngx.status }   # no fuse.settle(): the hook is missing
        location /call {
            content_by_lua_block {
                local app = require "exits_app"
                app.nohook:call(app.ending, "exit", tonumber(ngx.var.arg_status) or 200)
            }
        }
    }
}
EOF
  chmod -R a+rX "$T"
}

start_nginx() {
  start_rendered 2 write_conf "$P" || { diag "nginx did not start:" "$NGINX_START_ERR"; return 1; }
}

get() { curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1$2"; }
state() { curl -s -m 5 "http://127.0.0.1:$PORT/state?b=$1"; }
# wait_state NAME EXPECTED: the log phase runs just after the response: poll up to 2 s
wait_state() {
  local s
  for _ in $(seq 40); do
    s=$(state "$1")
    [ "$s" = "$2" ] && break
    sleep 0.05
  done
  echo "$s"
}
expect_state() { # expect_state DESCRIPTION NAME "STATE SUCC FAIL REJ"
  local got
  got=$(wait_state "$2" "$2 $3")
  check "$1" [ "$got" = "$2 $3" ]
  [ "$got" = "$2 $3" ] || diag "got:      $got" "expected: $2 $3"
}

start_nginx || bail "cannot start nginx"
MASTER=$(cat "$P/logs/nginx.pid" 2>/dev/null)
for _ in $(seq 50); do [ "$(get "$PORT" "/state?b=exit")" = 200 ] && break; sleep 0.1; done
workers=$(grep -l "^PPid:[[:space:]]*$MASTER\$" /proc/[0-9]*/status 2>/dev/null | wc -l)
check "nginx started, master $MASTER with 4 workers" [ "$workers" -eq 4 ]

# ---------------------------------------------------------------- closed state
codes=""
for _ in 1 2 3; do codes="$codes$(get "$PORT" '/call?b=exit&how=exit&status=502') "; done
check "three calls that end the request with ngx.exit(502) answered 502" [ "$codes" = "502 502 502 " ]
expect_state "they count as three failures, and the circuit opened (fails = 3)" exit "open 0 3 0"
check "the next call is rejected (503)" [ "$(get "$PORT" '/call?b=exit&how=exit&status=502')" = 503 ]

codes=""
for _ in 1 2; do codes="$codes$(get "$PORT" '/call?b=plain&how=exit&status=200') "; done
check "two calls that end the request with ngx.exit(200) answered 200" [ "$codes" = "200 200 " ]
expect_state "they count as two successes" plain "closed 2 0 0"
get "$PORT" '/call?b=plain&how=return&status=7' > /dev/null
expect_state "a call that returns normally counts once, not twice (guard and log phase)" plain "closed 3 0 0"

# ---------------------------------------------------------------- ngx.exec and ngx.redirect
check "ngx.exec to a location that answers 502" [ "$(get "$PORT" '/call?b=exec&how=exec&status=502')" = 502 ]
get "$PORT" '/call?b=exec&how=exec&status=204' > /dev/null
expect_state "ngx.exec counts by the final status: a 502 failure, a 204 success" exec "closed 1 1 0"
check "ngx.redirect answers 302" [ "$(get "$PORT" '/call?b=redirect&how=redirect')" = 302 ]
expect_state "ngx.redirect counts as a success" redirect "closed 1 0 0"

# ---------------------------------------------------------------- half-open: the probe
for _ in 1 2 3; do get "$PORT" '/call?b=probe&how=exit&status=500' > /dev/null; done
expect_state "probe breaker: opened by three ngx.exit(500)" probe "open 0 3 0"
sleep 1.2   # open_for = 1 s
check "after open_for, the probe ends its request with ngx.exit(200)" \
  [ "$(get "$PORT" '/call?b=probe&how=exit&status=200')" = 200 ]
expect_state "the probe counts as a success and closes the circuit (not held until probe_timeout)" \
  probe "closed 1 3 0"
codes=""
for _ in 1 2 3 4; do codes="$codes$(get "$PORT" '/call?b=probe&how=return&status=1') "; done
check "after it, calls go through again" [ "$codes" = "200 200 200 200 " ]

# a probe that ends the request with a 502 counts as the failure it is
for _ in 1 2 3; do get "$PORT" '/call?b=reprobe&how=exit&status=502' > /dev/null; done
expect_state "reprobe breaker: opened by three ngx.exit(502)" reprobe "open 0 3 0"
sleep 1.2
check "a probe that ends its request with ngx.exit(502)" \
  [ "$(get "$PORT" '/call?b=reprobe&how=exit&status=502')" = 502 ]
expect_state "counts as a failure and re-opens the circuit" reprobe "open 0 4 0"

# ---------------------------------------------------------------- no hook
# Without fuse.settle() the call ends with its request, uncounted. The next request nginx
# places at the same address finds it: it is counted as ignored (never a failure), and
# a warning names the missing hook. Sequential requests reuse addresses quickly.
codes=""
for _ in $(seq 24); do codes="$codes$(get "$PORT2" '/call?status=502')"; done
check "24 calls that end their request with ngx.exit(502) where fuse.settle() is missing" \
  [ "$codes" = "$(printf '502%.0s' $(seq 24))" ]
s=$(state nohook)
check "none counts as a failure: nohook stays closed with 0 failures" [ "${s% *}" = "nohook closed 0 0" ]
[ "${s% *}" = "nohook closed 0 0" ] || diag "state: $s"
warns=$(grep -c 'no fuse.settle() ran in the log phase' "$P/logs/error.log")
check "the missing hook is reported in the error log" [ "$warns" -ge 1 ]
check "at most once per worker" [ "$warns" -le 4 ]
grep -m 1 'no fuse.settle() ran' "$P/logs/error.log" | sed 's/^/# /'

# ---------------------------------------------------------------- error log
log_clean "$P/logs/error.log" "no [error], [alert], [crit] or [emerg] in the error log"

echo "1..$n"
[ "$failed" -eq 0 ]
