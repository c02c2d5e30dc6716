#!/usr/bin/env bash
# test/watch.t.sh -- fuse.watch under a real nginx with 4 workers (prints TAP): a
# callback that yields, and a reload.
#
# Starts nginx with 4 workers in a temp prefix, on a free loopback port. Each worker
# watches (fuse.watch, every 0.05 s) with a callback that logs "watch start PID SEQ
# FROM>TO" and "watch end PID SEQ" and, for closed -> forced_open, yields until a later
# transition is in the ring (fuse.events, at most 10 s), then 0.2 s more (4 polls' time): a
# callback that talks to a slow log collector over a cosocket. /open force-opens "w",
# /reset resets it.
# Checks, each step and what every worker must log:
#   fuse.watch in a content handler, and in init_by_lua (at the reload), raises, saying
#   where it belongs;
#   /open, then (once every worker logged its start) /reset: in each of the 4 workers
#   both transitions, once each, the second started after the first ended (ngx.timer.every
#   starts the next poll while the callback waits: fuse before this test delivered
#   forced_open -> closed in the middle of closed -> forced_open);
#   /disable, whose callback calls ngx.exit (ending the timer's coroutine inside pcall),
#   then /reset: every worker still hears disabled -> closed;
#   a reload (HUP), every old worker gone: /open and /reset again reach each of the 4 new
#   workers once each, in order, with seqs after the ones before the reload (one ring).
# Needs nginx with the Lua module and curl; without one it skips, except under CI=true,
# where it fails. About 3 s; a watchdog stops it after 120 s. KEEP=1 keeps the temp prefix.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
# shellcheck source=test/lib/tap.sh
. "$ROOT/test/lib/tap.sh"   # ok, nok, diag, check, bail, skip, skip_all
nginx_suite watch curl

# ---------------------------------------------------------------- setup
MASTER=
trap 'cleanup_nginx "${MASTER:-$(cat "$T/logs/nginx.pid" 2>/dev/null)}"' EXIT
watchdog 120

mkdir -p "$T/logs" "$T/temp"
copy_fuse "$T" "$LUA_SRC" "$SO_SRC"
chmod -R a+rX "$T"

render_conf() {
  {
    cat <<EOF
$(nginx_conf_head "$T" 4 notice 64)
    init_by_lua_block {
        local fuse = require "fuse"
        fuse.init{ shared = true, capacity = 64 }
        fuse.new{ name = "w", fails = 1 }
        ngx.log(ngx.NOTICE, "watch in init: ", select(2, pcall(fuse.watch, print)))
    }
    init_worker_by_lua_block {
        local fuse = require "fuse"
        local pid = ngx.worker.pid()
        fuse.watch(function(name, from, to, e)
            if name ~= "w" then return end
            ngx.log(ngx.NOTICE, "watch start ", pid, " ", e.seq, " ", from, ">", to)
            if to == "forced_open" then  -- yields until a later transition is in the ring,
                local deadline = ngx.now() + 10  -- then for 4 polls' time more
                while #fuse.events(e.seq) == 0 and ngx.now() < deadline do ngx.sleep(0.01) end
                ngx.sleep(0.2)
            end
            if to == "disabled" then ngx.exit(0) end  -- ends the timer's coroutine, inside pcall
            ngx.log(ngx.NOTICE, "watch end ", pid, " ", e.seq)
        end, 0.05)
        ngx.log(ngx.NOTICE, "watching in ", pid)
    }
    server {
        listen 127.0.0.1:$PORT;
        location = /open { content_by_lua_block { require("fuse").get("w"):force_open() ngx.say("ok") } }
        location = /in-content { content_by_lua_block { ngx.say(select(2, pcall(require("fuse").watch, print))) } }
        location = /disable { content_by_lua_block { require("fuse").get("w"):disable() ngx.say("ok") } }
        location = /reset { content_by_lua_block { require("fuse").get("w"):reset() ngx.say("ok") } }
    }
}
EOF
  } > "$T/nginx.conf"
  chmod a+r "$T/nginx.conf"
}
start_rendered 1 render_conf "$T" || bail "nginx did not start: $NGINX_START_ERR"
MASTER=$(cat "$T/logs/nginx.pid" 2>/dev/null)

get() { curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT$1"; }
sorted_workers() { workers | sort -n | tr '\n' ' '; }
# lines LABEL: the watch log lines ("start PID SEQ FROM>TO", "end PID SEQ"), in order
lines() { sed -n 's/.*watch \(start [0-9]* [0-9]* [a-z_]*>[a-z_]*\|end [0-9]* [0-9]*\),.*/\1/p' "$T/logs/error.log"; }
# pids_with PATTERN: the sorted pids of the watch lines that match PATTERN (one a line)
pids_with() { lines | grep -E "$1" | cut -d' ' -f2 | sort -n | tr '\n' ' '; }
# every_worker PATTERN: each worker now running logged a watch line that matches PATTERN
every_worker() { [ "$(pids_with "$1")" = "$(sorted_workers)" ]; }
# in_order PID: that worker's lines are start A, end A, start B, end B
in_order() {
  lines | awk -v pid="$1" '$2 == pid { printf "%s %s;", $1, $3 }' |
    grep -qxE 'start ([0-9]+);end \1;start ([0-9]+);end \2;'
}
# watching: every worker now running has started its watch (a watch hears the transitions
# made after it started)
watching() {
  [ "$(sed -n 's/.*watching in \([0-9]*\),.*/\1/p' "$T/logs/error.log" | sort -n | tr '\n' ' ')" = "$(sorted_workers)" ]
}
ends_at_least() { [ "$(lines | grep -c '^end')" -ge "$1" ]; }
four_workers() { [ "$(sorted_workers | wc -w)" = 4 ]; }
# round LABEL: /open, /reset and the checks of what the 4 workers heard; SEQS: the seqs
# they heard
round() {
  local label=$1 ok_order=1 p
  wait_for 10 watching || diag "$label: not every worker started its watch"
  [ "$(get /open)" = 200 ] || { nok "$label: /open answered"; return; }
  wait_for 10 every_worker "^start [0-9]+ [0-9]+ closed>forced_open$" ||
    diag "$label: not every worker started closed>forced_open: $(pids_with 'closed>forced_open')"
  [ "$(get /reset)" = 200 ] || { nok "$label: /reset answered"; return; }
  wait_for 15 ends_at_least 8 || diag "$label: fewer than 8 callbacks ended"
  check "$label: each of the 4 workers heard closed>forced_open and forced_open>closed, once each" \
    [ "$(pids_with ' closed>forced_open$')/$(pids_with ' forced_open>closed$')" = "$(sorted_workers)/$(sorted_workers)" ]
  for p in $(workers); do in_order "$p" || ok_order=0; done
  check "$label: in each worker the second callback started after the first ended (a yielding callback)" \
    [ $ok_order = 1 ]
  [ $ok_order = 1 ] || diag "$(lines | tail -n 16)"
  SEQS=$(lines | grep '^start' | cut -d' ' -f3 | sort -un | tr '\n' ' ')
}
# follows BEFORE AFTER: every seq of AFTER is above every seq of BEFORE (both not empty)
follows() {
  local last first
  # shellcheck disable=SC2086  # the seqs, one word each
  last=$(printf '%s\n' $1 | tail -n 1) first=$(printf '%s\n' $2 | head -n 1)
  [ -n "$last" ] && [ -n "$first" ] && [ "$first" -gt "$last" ]
}

four_workers || bail "nginx has not 4 workers: $(sorted_workers)"
WANT="fuse: fuse.watch belongs in init_worker_by_lua* (it watches for the worker's life), not in"
check "fuse.watch in a content handler raises, saying where it belongs (was: a watch more per request)" \
  [ "$(curl -s -m 5 "http://127.0.0.1:$PORT/in-content")" = "$WANT the content phase" ]
round "first start"
before=$SEQS
[ "$(get /disable)" = 200 ] && wait_for 10 every_worker "^start [0-9]+ [0-9]+ closed>disabled$" &&
  [ "$(get /reset)" = 200 ] && wait_for 10 every_worker "^start [0-9]+ [0-9]+ disabled>closed$"
check "a callback that called ngx.exit (closed>disabled) did not stop the watch: each worker heard disabled>closed" \
  every_worker "^start [0-9]+ [0-9]+ disabled>closed$"
OLD=$(workers)
: > "$T/logs/error.log"
kill -HUP "$MASTER"
# shellcheck disable=SC2086  # the pids, one word each
reloaded 20 $OLD || bail "the old workers did not exit after the reload"
wait_for 10 four_workers || bail "no 4 new workers after the reload: $(sorted_workers)"
round "after a reload"
# (the master's log at the first start is nginx's stderr: the reload's is the error log)
check "fuse.watch in init_by_lua (at the reload) raises, saying where it belongs (was: \"no request\")" \
  grep -qF "watch in init: $WANT init_by_lua* (the master, which runs no timers)" "$T/logs/error.log"
diag "seqs before the reload: $before; after: $SEQS"
check "after a reload the ring goes on: the seqs after it follow those before it" follows "$before" "$SEQS"

log_clean "$T/logs/error.log" "no [error], [alert], [crit] or [emerg] in the nginx error log"

echo "1..$n"
[ "$failed" -eq 0 ]
