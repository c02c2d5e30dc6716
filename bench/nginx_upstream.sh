#!/usr/bin/env bash
# bench/nginx_upstream.sh -- fuse.upstream against nginx's own balancer, side by side in
# one run (`make bench-nginx`). Bounded: about 2 minutes.
#
# One nginx serves three fake peers A B C (examples/nginx/peers.conf). A second nginx
# (2 workers) fronts them twice, with the same peers, timeouts and proxy_next_upstream:
#   fuse   balancer_by_lua: fuse.upstream, fails = 3, window = 10, open_for = 5, probes = 1
#   nginx  upstream { zone; server ... max_fails=3 fail_timeout=5s; }  (passive checks)
#   backoff  fuse.upstream as above plus backoff = 2, max_open_for = 20 (part 1 only)
#   rr     upstream { server ...; }  plain round robin (the throughput baseline, part 2)
#
# 1. Failure script, under wrk load (16 connections), the same for fuse and nginx:
#    3 s healthy, then B answers 500 for 12 s, then B heals; 10 s more. Reported: the
#    requests that reached B while it was sick, the errors clients saw (non-2xx and socket
#    errors), and the time from the heal until B answered a request again.
# 2. Throughput with every peer healthy: fuse vs plain round robin over three static
#    peers (return 200, in the front nginx), keepalive on both: ROUNDS pairs of 2 s wrk
#    rounds (16 connections) in alternating order; the median of each side and the
#    median of the pairs' ratios (the machine's load drifts; a pair shares it).
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
NGINX=$(nginx_bin)
ROUNDS=${ROUNDS:-7}
# FAILURES=0 skips part 1
die() { echo "bench-nginx: $*" >&2; exit 1; }
[ -x "$NGINX" ] || die "nginx is not installed"
command -v wrk >/dev/null || die "wrk is not installed"
command -v curl >/dev/null || die "curl is not installed"
[ -r "$ROOT/build/fuse/core.so" ] || die "build/fuse/core.so is missing: run make first"

T=$(mktemp -d /tmp/fuse-bench-nginx.XXXXXX) || die "mktemp failed"
P=$T/examples/nginx
PIDS=()
trap 'cleanup_nginx "${PIDS[@]}"' EXIT
trap 'exit 1' INT TERM HUP

mkdir -p "$P/logs-peers" "$P/logs-front" "$P/temp"
copy_fuse "$T"
cp "$ROOT/examples/nginx/peers.lua" "$P/"
BASE=$(pick_ports 15) || die "no 15 free ports in a row"
FUSE=$BASE NGX=$((BASE + 1)) CTL=$((BASE + 2)) A=$((BASE + 3)) B=$((BASE + 4)) C=$((BASE + 5))
RR=$((BASE + 7)) FS=$((BASE + 8)) RS=$((BASE + 9)) S1=$((BASE + 10)) S2=$((BASE + 11)) S3=$((BASE + 12)) LS=$((BASE + 13)) FB=$((BASE + 14))
sed -e "s/127\.0\.0\.1:18090/127.0.0.1:$CTL/g" -e "s/127\.0\.0\.1:18091/127.0.0.1:$A/g" \
  -e "s/127\.0\.0\.1:18092/127.0.0.1:$B/g" -e "s/127\.0\.0\.1:18093/127.0.0.1:$C/g" \
  -e "s/127\.0\.0\.1:18094/127.0.0.1:$((BASE + 6))/g" \
  "$ROOT/examples/nginx/peers.conf" > "$P/peers.conf"

cat > "$P/front.conf" <<EOF
$(nginx_load_modules)
worker_processes 2;
pid logs-front/nginx.pid;
error_log logs-front/error.log crit;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path temp/body;
    proxy_temp_path temp/proxy;
    lua_package_path "\$prefix/../../lua/?.lua;;";
    lua_package_cpath "\$prefix/../../build/?.so;;";
    init_by_lua_block {
        require("fuse").init{ shared = true, capacity = 64 }
        package.loaded.pool = require("fuse.upstream").new("bench", {
            "127.0.0.1:$A", "127.0.0.1:$B", "127.0.0.1:$C",
        }, { fails = 3, window = 10, open_for = 5, probes = 1, probe_timeout = 5 })
        package.loaded.pool2 = require("fuse.upstream").new("backoff", {
            "127.0.0.1:$A", "127.0.0.1:$B", "127.0.0.1:$C",
        }, { fails = 3, window = 10, open_for = 5, probes = 1, probe_timeout = 5,
             backoff = 2, max_open_for = 20 })
        package.loaded.static = require("fuse.upstream").new("static", {
            "127.0.0.1:$S1", "127.0.0.1:$S2", "127.0.0.1:$S3",
        }, { fails = 3, window = 10, open_for = 5 })
    }
    upstream fuse_pool {
        server 0.0.0.1;
        balancer_by_lua_block { require("pool"):balance() }
        keepalive 32;
    }
    upstream fuse_backoff {
        server 0.0.0.1;
        balancer_by_lua_block { require("pool2"):balance() }
        keepalive 32;
    }
    server {
        listen 127.0.0.1:$FB;
        location / { proxy_pass http://fuse_backoff; log_by_lua_block { require("pool2"):log() } }
    }
    upstream nginx_pool {
        zone nginx_pool 64k;
        server 127.0.0.1:$A max_fails=3 fail_timeout=5s;
        server 127.0.0.1:$B max_fails=3 fail_timeout=5s;
        server 127.0.0.1:$C max_fails=3 fail_timeout=5s;
        keepalive 32;
    }
    upstream rr_pool {
        server 127.0.0.1:$A;
        server 127.0.0.1:$B;
        server 127.0.0.1:$C;
        keepalive 32;
    }
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_next_upstream error timeout http_500 http_502 http_503 http_504;
    proxy_connect_timeout 1s;
    proxy_read_timeout 1s;
    server {
        listen 127.0.0.1:$FUSE;
        location / { proxy_pass http://fuse_pool; log_by_lua_block { require("pool"):log() } }
    }
    server {
        listen 127.0.0.1:$NGX;
        location / { proxy_pass http://nginx_pool; }
    }
    server {
        listen 127.0.0.1:$RR;
        location / { proxy_pass http://rr_pool; }
    }
    # part 2: three static peers (cheap, so that the balancers' own cost shows)
    upstream fuse_static {
        server 0.0.0.1;
        balancer_by_lua_block { require("static"):balance() }
        keepalive 32;
    }
    upstream rr_static {
        server 127.0.0.1:$S1;
        server 127.0.0.1:$S2;
        server 127.0.0.1:$S3;
        keepalive 32;
    }
    server {
        listen 127.0.0.1:$FS;
        location / { proxy_pass http://fuse_static; log_by_lua_block { require("static"):log() } }
    }
    server {
        listen 127.0.0.1:$RS;
        location / { proxy_pass http://rr_static; }
    }
    # the floor of any Lua balancer: balancer_by_lua with a bare round robin, no log phase
    upstream lua_static {
        server 0.0.0.1;
        balancer_by_lua_block {
            local i = (package.loaded.lua_rr or 0) % 3 + 1
            package.loaded.lua_rr = i
            require("ngx.balancer").set_current_peer("127.0.0.1", ($S1 - 1) + i)
        }
        keepalive 32;
    }
    server {
        listen 127.0.0.1:$LS;
        location / { proxy_pass http://lua_static; }
    }
    server {
        listen 127.0.0.1:$S1;
        listen 127.0.0.1:$S2;
        listen 127.0.0.1:$S3;
        keepalive_requests 100000;
        location / { return 200 "ok\n"; }
    }
}
EOF
chmod -R a+rX "$T"
"$NGINX" -p "$P/" -c peers.conf || die "the peers did not start"
PIDS+=("$(cat "$P/logs-peers/nginx.pid")")
"$NGINX" -p "$P/" -c front.conf || die "the front did not start"
PIDS+=("$(cat "$P/logs-front/nginx.pid")")
for _ in $(seq 50); do curl -s -m 1 -o /dev/null "http://127.0.0.1:$FUSE/" && break; sleep 0.1; done

mode() { curl -s -m 5 "http://127.0.0.1:$CTL/control?port=$1&$2" > /dev/null; }
hits() { curl -s -m 5 "http://127.0.0.1:$CTL/control?port=$1" | sed -n 's/^hits=\([0-9]*\).*/\1/p'; }
now() { date +%s.%N; }
non2xx() { # wrk output -> non-2xx + socket errors
  awk '/Non-2xx/ { n += $5 } /Socket errors/ { gsub(",", ""); n += $4 + $6 + $8 + $10 } END { print n + 0 }' "$1"
}

echo "bench-nginx: $(date -u +%Y-%m-%dT%H:%MZ), nginx $("$NGINX" -v 2>&1 | cut -d/ -f2), $(nproc) CPUs"
echo
echo "1. failure script (16 connections, 25 s: 3 s healthy, B answers 500 for 12 s, then heals)"
printf '%-8s %12s %14s %14s %16s\n' side requests "reached sick B" "client errors" "B back after (s)"
failure_script() { # failure_script NAME PORT
  local name=$1 port=$2 t_heal back="" h sick total errs
  for p in $A $B $C; do mode "$p" 'mode=ok&reset=1'; done
  wrk -t 2 -c 16 -d 25s "http://127.0.0.1:$port/" > "$T/wrk-$name.out" 2>&1 &
  local wp=$!
  sleep 3
  mode "$B" 'mode=fail&reset=1'
  sleep 12
  sick=$(hits "$B")
  mode "$B" 'mode=ok&reset=1'
  t_heal=$(now)
  for _ in $(seq 240); do          # B answers again: poll its hits every 50 ms (12 s max)
    h=$(hits "$B")
    if [ "${h:-0}" -gt 0 ]; then back=$(echo "$(now) - $t_heal" | bc); break; fi
    sleep 0.05
  done
  wait "$wp"
  total=$(awk '/requests in/ { print $1 }' "$T/wrk-$name.out")
  errs=$(non2xx "$T/wrk-$name.out")
  printf '%-8s %12s %14s %14s %16s\n' "$name" "$total" "$sick" "$errs" "${back:->12}"
}
if [ "${FAILURES:-1}" = 1 ]; then
  failure_script fuse "$FUSE"
  sleep 6                                  # let every breaker and nginx's peer state settle
  failure_script nginx "$NGX"
  sleep 6
  failure_script backoff "$FB"   # fuse with backoff = 2 (open 5, 10, 20 s): nginx has no such rule
fi

echo
echo "2. throughput, every peer healthy: $ROUNDS pairs of 2 s wrk rounds (16 connections), in"
echo "   alternating order, against three static peers (return 200) with keepalive"
wrk -t 2 -c 16 -d 2s "http://127.0.0.1:$FS/" > /dev/null 2>&1   # warm-up (JIT, keepalive)
wrk -t 2 -c 16 -d 2s "http://127.0.0.1:$RS/" > /dev/null 2>&1
FRONT_WORKERS=$(ps -o pid= --ppid "${PIDS[1]}" | tr -d ' ' | tr '\n' ' ')
ticks() { # CPU time (user + system, clock ticks) of the front nginx's workers
  local t=0 w
  for w in $FRONT_WORKERS; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$w/stat"))); done
  echo "$t"
}
HZ=$(getconf CLK_TCK)
# rps PORT: requests/s of one round; sets US, the front's CPU microseconds per request
rps() {
  local t0 t1 out
  t0=$(ticks)
  out=$(wrk -t 2 -c 16 -d 2s "http://127.0.0.1:$1/" 2>&1)
  t1=$(ticks)
  local n r
  n=$(awk '/requests in/ { print $1 }' <<< "$out") r=$(awk '/Requests\/sec/ { print $2 }' <<< "$out")
  US=$(echo "($t1 - $t0) * 1000000 / $HZ / $n" | bc -l)
  echo "$r $US"
}
f_all="" r_all="" q_all="" fu_all="" ru_all=""
for i in $(seq "$ROUNDS"); do
  if [ $((i % 2)) = 1 ]; then read -r f fu <<< "$(rps "$FS")"; read -r r ru <<< "$(rps "$RS")"
  else read -r r ru <<< "$(rps "$RS")"; read -r f fu <<< "$(rps "$FS")"; fi
  q=$(echo "$f / $r" | bc -l)
  f_all="$f_all $f" r_all="$r_all $r" q_all="$q_all $q" fu_all="$fu_all $fu" ru_all="$ru_all $ru"
  printf '   pair %d: fuse.upstream %7.0f req/s %5.1f us CPU/req   round robin %7.0f req/s %5.1f us CPU/req   ratio %.3f\n' \
    "$i" "$f" "$fu" "$r" "$ru" "$q"
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
fm=$(echo "$f_all" | median) rm=$(echo "$r_all" | median) qm=$(echo "$q_all" | median)
fum=$(echo "$fu_all" | median) rum=$(echo "$ru_all" | median)
lu_all=""
for i in $(seq 3); do read -r _ lu <<< "$(rps "$LS")"; lu_all="$lu_all $lu"; done
lum=$(echo "$lu_all" | median)
printf '   medians: fuse.upstream %.0f req/s, round robin %.0f req/s; median ratio of the pairs %.3f (target >= 0.95)\n' \
  "$fm" "$rm" "$qm"
printf '   front nginx CPU per request (median): fuse.upstream %.1f us, round robin %.1f us (+%.1f us);\n' \
  "$fum" "$rum" "$(echo "$fum - $rum" | bc -l)"
printf '   a bare Lua round robin in balancer_by_lua (3 rounds, the floor of any Lua balancer): %.1f us\n' "$lum"
