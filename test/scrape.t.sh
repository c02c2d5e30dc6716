#!/usr/bin/env bash
# test/scrape.t.sh -- a /metrics scrape of many breakers in a real nginx lets its worker
# serve other requests meanwhile (prints TAP).
#
# nginx with 2 workers and 60,000 breakers in the shared registry (a scrape of them is
# about 0.2 s of CPU). /metrics logs "scrape start", calls fuse.metrics(), logs "scrape
# end" and prints the text; /ping logs "ping I" and answers the worker's pid. The test
# holds two keep-alive connections to one worker W (it opens connections until one
# lands on the worker of the first: reuseport spreads them), asks /metrics on the first
# and, while that answer has not ended, asks /ping again and again on the second, each
# after the answer to the one before. It expects, in W's lines of the error log, a
# "ping" between "scrape start" and "scrape end": W served a request in the middle of
# the scrape. No time is measured: a scrape that never gives the worker back (fuse
# 1fb4fcc and before) leaves every ping of W before its start or after its end, whatever the
# speed of the machine. The same for /metrics-parts, fuse.metrics_chunks(ngx.print) with
# a "part K start" line per part: a ping of W between the first part and "parts end"
# (where fuse.metrics() joins the text and ngx.print copies it, in one go; fails on
# 5c4fac2, which has no metrics_chunks), at least one part per 32768 lines, and its
# text is /metrics' byte for byte. Also: the text is whole (a fuse_state line per
# breaker), a scrape in header_filter_by_lua (which cannot yield) and one in a timer
# (which does) work, and the error log holds no error.
# Needs nginx with the Lua module; without it it skips, except under CI=true, where it
# fails. About 10 s; a watchdog stops it after 180 s. KEEP=1 keeps the temp prefix;
# FUSE_LUA_DIR=DIR runs another tree's lua/ (e.g. to see the test fail on an old one).
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
# shellcheck source=test/lib/tap.sh
. "$ROOT/test/lib/tap.sh"   # ok, nok, diag, check, bail, skip, skip_all
N=60000
nginx_suite scrape
trap 'cleanup_nginx "$(cat "$T/logs/nginx.pid" 2>/dev/null)"' EXIT
watchdog 180

mkdir -p "$T/logs" "$T/temp"
copy_fuse "$T" "$LUA_SRC" "$SO_SRC"

render_conf() {
  {
    cat <<EOF
$(nginx_conf_head "$T" 2 warn 64)
    init_by_lua_block {
        local fuse = require "fuse"
        fuse.init{ shared = true, capacity = 65536 }
        for i = 1, $N do fuse.new{ name = ("scrape-%05d"):format(i), fails = 5 } end
    }
    init_worker_by_lua_block {
        ngx.timer.at(0, function()
            ngx.log(ngx.WARN, "timer scrape of ", #require("fuse").metrics(), " bytes")
        end)
    }
    server {
        listen 127.0.0.1:$PORT reuseport;
        location = /metrics {
            default_type "text/plain; version=0.0.4";
            content_by_lua_block {
                ngx.log(ngx.WARN, "scrape start")
                local text = require("fuse").metrics()
                ngx.log(ngx.WARN, "scrape end")
                ngx.print(text)
            }
        }
        location = /metrics-parts {
            default_type "text/plain; version=0.0.4";
            content_by_lua_block {
                local k = 0
                require("fuse").metrics_chunks(function(part)
                    k = k + 1
                    ngx.log(ngx.WARN, "part ", k, " start")
                    ngx.print(part)
                end)
                ngx.log(ngx.WARN, "parts end (", k, ")")
            }
        }
        location = /ping {
            content_by_lua_block {
                ngx.log(ngx.WARN, "ping ", ngx.var.arg_i)
                local pid = tostring(ngx.worker.pid())
                ngx.header["Content-Length"] = #pid
                ngx.print(pid)
            }
        }
        location = /in-header-filter {
            content_by_lua_block { ngx.print("x") }
            header_filter_by_lua_block {
                ngx.header["X-Metrics-Bytes"] = #require("fuse").metrics()
            }
        }
    }
}
EOF
  } > "$T/nginx.conf"
  chmod a+r "$T/nginx.conf"
}
start_rendered 1 render_conf "$T" || bail "nginx did not start: $NGINX_START_ERR"
wait_for 60 curl -s -o /dev/null -m 1 "http://127.0.0.1:$PORT/ping" || bail "nginx does not answer"

# ping FD I: /ping?i=I on the keep-alive connection FD; prints the pid that answered.
ping() {
  local fd=$1 line len=0 body
  printf 'GET /ping?i=%s HTTP/1.1\r\nHost: t\r\n\r\n' "$2" >&"$fd" || return 1
  IFS= read -r -t 30 line <&"$fd" || return 1
  case $line in "HTTP/1.1 200"*) ;; *) return 1 ;; esac
  while IFS= read -r -t 30 line <&"$fd"; do
    line=${line%$'\r'}
    [ -z "$line" ] && break
    case $line in [Cc]ontent-[Ll]ength:*) len=${line#*: } ;; esac
  done
  IFS= read -r -t 30 -N "$len" body <&"$fd" || return 1
  echo "$body"
}
# connect: a new connection to nginx, its descriptor in FD
connect() { exec {FD}<>"/dev/tcp/127.0.0.1/$PORT"; }
# on_w: a new keep-alive connection to worker W, its descriptor in FD (up to 60 tries:
# reuseport spreads connections over the workers)
on_w() {
  local i
  for i in $(seq 60); do
    connect || return 1
    [ "$(ping "$FD" "c$i")" = "$W" ] && return 0
    exec {FD}>&-
  done
  return 1
}

connect || bail "cannot connect to nginx"
S=$FD
W=$(ping "$S" 0) || bail "no answer to /ping"
on_w || bail "60 connections, none on worker $W"
C=$FD

# W's lines of the error log, from line $1 on
w_lines() { tail -n "+$1" "$T/logs/error.log" | grep -F "] $W#"; }

# pings_within PATH FROM_RE TO_RE: up to 3 scrapes of PATH on S (each on a new
# connection to W), each while pinging W on C, until one has a ping of W between a log
# line FROM_RE and the next TO_RE (a ping that reached W before proves nothing, nor does
# one after: try again). Sets between (the pings) and tries; the text in $T/scrape.TRY.
i=1000
pings_within() {
  local path=$1 from_re=$2 to_re=$3 try from reader
  between=0 tries=0
  for try in 1 2 3; do
    tries=$try
    from=$(($(wc -l < "$T/logs/error.log") + 1))
    printf 'GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n' "$path" >&"$S"
    cat <&"$S" > "$T/scrape.$try" &
    reader=$!
    while kill -0 "$reader" 2>/dev/null && [ "$i" -lt 100000 ]; do
      i=$((i + 1))
      [ "$(ping "$C" "$i")" = "$W" ] || bail "ping $i: no answer from worker $W"
      w_lines "$from" | grep -qE "$to_re" && break
    done
    wait "$reader"
    wait_for 30 eval 'w_lines "$from" | grep -qE "$to_re"' || bail "no \"$to_re\" in worker $W's log"
    between=$(w_lines "$from" | awk -v a="$from_re" -v b="$to_re" '$0 ~ a { s = 1 } $0 ~ b { s = 0 } s && /ping / { n++ } END { print n + 0 }')
    diag "$path, try $try: $between pings of worker $W between \"$from_re\" and \"$to_re\""
    exec {S}>&-
    on_w || bail "60 connections, none on worker $W"
    S=$FD
    [ "$between" -gt 0 ] && break
  done
}

pings_within /metrics "scrape start" "scrape end"
check "worker $W served requests in the middle of a scrape ($between pings, scrape $tries)" [ "$between" -gt 0 ]

lines=$(grep -c '^fuse_state{name="scrape-' "$T/scrape.$tries")
check "the scrape is whole: $lines fuse_state lines for $N breakers" [ "$lines" -eq "$N" ]
check "the scrape ends with the registry's series" grep -q '^fuse_registry_evictions_total 0' "$T/scrape.$tries"

# fuse.metrics_chunks(ngx.print): W serves requests between its parts, where
# fuse.metrics() makes the text one string and ngx.print copies it, in one go
pings_within /metrics-parts "part 1 start" "parts end"
check "worker $W served requests between the first and the last part of metrics_chunks ($between pings, try $tries)" \
  [ "$between" -gt 0 ]
parts=$(w_lines 1 | grep -c "part [0-9]* start")
check "metrics_chunks wrote $parts parts (at least one per 32768 lines: 20 for $N breakers)" [ "$parts" -ge 20 ]
curl -s -o "$T/text" -m 60 "http://127.0.0.1:$PORT/metrics"
curl -s -o "$T/text-parts" -m 60 "http://127.0.0.1:$PORT/metrics-parts"
check "the text of metrics_chunks is fuse.metrics()' text ($(wc -c < "$T/text-parts") bytes)" \
  cmp -s "$T/text" "$T/text-parts"

hdr=$(curl -s -D - -o /dev/null -m 60 "http://127.0.0.1:$PORT/in-header-filter" | tr -d '\r' |
  sed -n 's/^X-Metrics-Bytes: //Ip')
check "a scrape in header_filter_by_lua (no yield) works: $hdr bytes" [ "${hdr:-0}" -gt 1000000 ]
timer_scrapes() { [ "$(grep -c "timer scrape of [0-9]\{7,\} bytes" "$T/logs/error.log")" -eq 2 ]; }
check "a scrape in a timer works, in each worker" wait_for 60 timer_scrapes
errors=$(grep -E '\[(error|crit|alert|emerg)\]' "$T/logs/error.log" | head -n 5)
check "no error in the error log" [ -z "$errors" ]
[ -z "$errors" ] || diag "$errors"

echo "1..$n"
[ "$failed" -eq 0 ]
