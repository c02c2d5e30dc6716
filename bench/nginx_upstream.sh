#!/usr/bin/env bash
# bench/nginx_upstream.sh -- fuse.upstream against nginx's own balancer, side by side in
# one run (`make bench-nginx`). Bounded: about 4 minutes.
#
# One nginx serves the fake peers (examples/nginx/peers.conf, 12 ports: a set of three
# per side, so that the sides run at once and share the machine's load). A second nginx
# (2 workers) fronts them, same timeouts and proxy_next_upstream everywhere:
#   fuse     balancer_by_lua: fuse.upstream, fails = 3, open_for = 5, probes = 1,
#            backoff = 2 (open 5, then 10 s; max_open_for 10)
#   nginx    upstream { zone; server ... max_fails=3 fail_timeout=5s; }
#   fuse5    fuse.upstream without backoff (open 5 s every time), for reference
#   fuse6    fuse.upstream with backoff = 2 capped at max_open_for = 6 (open 5, then 6 s):
#            about nginx's own probe period (fail_timeout=5s, counted in whole seconds),
#            so that each run shows both sides at the same recovery, for reference
#   fusec    fuse.upstream with the option check (GET /health, asked every 0.25 s in each
#            worker), backoff = 2 capped at max_open_for = 5 (open 5 s every time): its
#            probes are the pool's checks, counted apart from client requests
# A third nginx (1 worker) is the load generator: a timer that sends RATE requests/s
# (Connection: close) at one front port and counts the statuses, so the load is the
# same on every side whatever a side's latency (wrk would send more to the faster one).
#
# 1. Outage: 5 s healthy, then B answers 500 for OUTAGE (60) s, then heals; at 50
#    requests/s. Reported per side: requests that reached the sick B, client errors
#    (non-200), seconds from the heal until B answered a request again.
# 2. Two sick peers of three (B and C answer 500 for 20 s, tries 2 on every side:
#    proxy_next_upstream_tries 2 for nginx): client errors.
# 3. Throughput with every peer healthy (three static peers, return 200, keepalive):
#    ROUNDS rounds of 2 s wrk (16 connections) of each of fuse.upstream, nginx's plain
#    round robin, the floor of any Lua balancer (balancer_by_lua calling
#    set_current_peer, an empty log_by_lua) and that floor plus what a balancer that
#    reports needs (a table in ngx.ctx, one $upstream_status read), and the floor again
#    on a front of its own (floor'/floor: the bench's own error, two fronts doing the
#    same work), in rotating order; the medians, the median per-round ratios with their
#    95% intervals, and the front's CPU time per request (and its user-space part).
#    bench/nginx_upstream_share.sh measures the same fronts at once on one core, which
#    the machine's swings do not move.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
# shellcheck source=bench/upstream_fronts.sh
. "$ROOT/bench/upstream_fronts.sh"
NGINX=$(nginx_bin)
ROUNDS=${ROUNDS:-9}
OUTAGE=${OUTAGE:-60}
RATE=${RATE:-50}
MAX_OPEN_FOR=${MAX_OPEN_FOR:-10}   # the fuse side's cap on its backoff
# How B is sick in part 1: fail (500 at once), or hang (no answer within the fronts' 1 s
# read timeout: B holds each request OUTAGE_DELAY s), or refuse (connections reset)
OUTAGE_MODE=${OUTAGE_MODE:-fail}
OUTAGE_DELAY=${OUTAGE_DELAY:-5}
case $OUTAGE_MODE in fail) SICK_AS="answers 500" ;; hang) SICK_AS="hangs ($OUTAGE_DELAY s, the fronts time out at 1 s)" ;;
  refuse) SICK_AS="resets every connection" ;; *) echo "bench-nginx: OUTAGE_MODE is fail, hang or refuse" >&2; exit 1 ;; esac
# FAILURES=0 skips parts 1 and 2, THROUGHPUT=0 part 3
# AFFINITY=1: the front's two workers pinned one to each CPU (worker_cpu_affinity auto),
# as gateways are often run; by default the scheduler places them (and moves them, about
# 100 to 250 times a second under part 3's load)
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

mkdir -p "$P/logs-peers" "$P/logs-front" "$P/logs-load" "$P/temp"
copy_fuse "$T"
cp "$ROOT/examples/nginx/peers.lua" "$P/"
BASE=$(pick_ports 30) || die "no 30 free ports in a row"
CTL=$BASE LOAD=$((BASE + 1))
A1=$((BASE + 2)) B1=$((BASE + 3)) C1=$((BASE + 4))      # fuse (backoff)
A2=$((BASE + 5)) B2=$((BASE + 6)) C2=$((BASE + 7))      # nginx
A3=$((BASE + 8)) B3=$((BASE + 9)) C3=$((BASE + 10))     # fuse5
F1=$((BASE + 11)) F2=$((BASE + 12)) F3=$((BASE + 13))   # fronts of part 1 and 2
FS=$((BASE + 14)) RS=$((BASE + 15)) LS=$((BASE + 16)) XS=$((BASE + 20))   # fronts of part 3
S1=$((BASE + 17)) S2=$((BASE + 18)) S3=$((BASE + 19))   # static peers
A4=$((BASE + 21)) B4=$((BASE + 22)) C4=$((BASE + 23)) F4=$((BASE + 24))   # fuse6: peers, front
YS=$((BASE + 25))   # part 3: the floor again (the bench's own error)
A5=$((BASE + 26)) B5=$((BASE + 27)) C5=$((BASE + 28)) F5=$((BASE + 29))   # fusec: peers, front
sed -e "s/127\.0\.0\.1:18090/127.0.0.1:$CTL/" \
  -e "s/listen 127\.0\.0\.1:18091;/listen 127.0.0.1:$A1; listen 127.0.0.1:$A2; listen 127.0.0.1:$A3; listen 127.0.0.1:$A4; listen 127.0.0.1:$A5;/" \
  -e "s/listen 127\.0\.0\.1:18092;/listen 127.0.0.1:$B1; listen 127.0.0.1:$B2; listen 127.0.0.1:$B3; listen 127.0.0.1:$B4; listen 127.0.0.1:$B5;/" \
  -e "s/listen 127\.0\.0\.1:18093;/listen 127.0.0.1:$C1; listen 127.0.0.1:$C2; listen 127.0.0.1:$C3; listen 127.0.0.1:$C4; listen 127.0.0.1:$C5;/" \
  -e "/127\.0\.0\.1:18094/d" "$ROOT/examples/nginx/peers.conf" > "$P/peers.conf"

pool_lines() { # pool_lines NAME A B C OPTIONS
  echo "        package.loaded[\"$1\"] = up.new(\"$1\", { \"127.0.0.1:$2\", \"127.0.0.1:$3\", \"127.0.0.1:$4\" }, $5)"
}
fuse_server() { # fuse_server PORT POOL
  cat <<EOF
    upstream up_$2 { server 0.0.0.1; balancer_by_lua_block { require("$2"):balance() } keepalive 32; }
    server { listen 127.0.0.1:$1; location / { proxy_pass http://up_$2; log_by_lua_block { require("$2"):log() } } }
EOF
}
cat > "$P/front.conf" <<EOF
$(nginx_load_modules)
worker_processes 2;
$([ "${AFFINITY:-0}" = 1 ] && echo "worker_cpu_affinity auto;")
pid logs-front/nginx.pid;
error_log logs-front/error.log crit;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path temp/body;
    proxy_temp_path temp/proxy;
    lua_package_path "\$prefix/../../lua/?.lua;;";
    lua_package_cpath "\$prefix/../../build/?.so;;";
    lua_shared_dict fuse_upstream 1m;
    init_by_lua_block {
        require("fuse").init{ shared = true, capacity = 64 }
        local up = require "fuse.upstream"
$(pool_lines fuse "$A1" "$B1" "$C1" "{ fails = 3, window = 10, open_for = 5, probes = 1, probe_timeout = 5, backoff = 2, max_open_for = $MAX_OPEN_FOR, tries = 2 }")
$(pool_lines fuse5 "$A3" "$B3" "$C3" "{ fails = 3, window = 10, open_for = 5, probes = 1, probe_timeout = 5, tries = 2 }")
$(pool_lines fuse6 "$A4" "$B4" "$C4" "{ fails = 3, window = 10, open_for = 5, probes = 1, probe_timeout = 5, backoff = 2, max_open_for = 6, tries = 2 }")
$(pool_lines fusec "$A5" "$B5" "$C5" "{ fails = 3, window = 10, open_for = 5, probes = 1, probe_timeout = 5, backoff = 2, max_open_for = 5, tries = 2, check = { path = \"/health\", interval = 0.25 } }")
$(pool_lines static "$S1" "$S2" "$S3" "{ fails = 3, window = 10, open_for = 5 }")
    }
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_next_upstream error timeout http_500 http_502 http_503 http_504;
    proxy_next_upstream_tries 2;
    proxy_connect_timeout 1s;
    proxy_read_timeout 1s;
$(fuse_server "$F1" fuse)
$(fuse_server "$F3" fuse5)
$(fuse_server "$F4" fuse6)
$(fuse_server "$F5" fusec)
    upstream nginx_pool {
        zone nginx_pool 64k;
        server 127.0.0.1:$A2 max_fails=3 fail_timeout=5s;
        server 127.0.0.1:$B2 max_fails=3 fail_timeout=5s;
        server 127.0.0.1:$C2 max_fails=3 fail_timeout=5s;
        keepalive 32;
    }
    server { listen 127.0.0.1:$F2; location / { proxy_pass http://nginx_pool; } }
    # part 3: fuse.upstream, round robin and the floor of any Lua balancer (the same two
    # Lua phases, doing nothing but set_current_peer), as bench/upstream_fronts.sh has them
$(static_front f)
$(static_front r)
$(static_front l)
    # the floor plus what any balancer that reports needs: per-request state in ngx.ctx
    # (a table set in the balancer, read in the log phase) and one \$upstream_status read
    upstream ctx_static {
        server 0.0.0.1;
        balancer_by_lua_block {
            local i = (package.loaded.lua_rr or 0) % 3 + 1
            package.loaded.lua_rr = i
            ngx.ctx.try = { n = 1, peer = i }
            require("ngx.balancer").set_current_peer("127.0.0.1", ($S1 - 1) + i)
        }
        keepalive 32;
    }
    server { listen 127.0.0.1:$XS; location / { proxy_pass http://ctx_static;
        log_by_lua_block { local t, s = ngx.ctx.try, ngx.var.upstream_status } } }
    # the floor again, on a port and upstream of its own: floor'/floor is the bench's own
    # error, what the rounds read for two fronts that do the same work
$(static_front l | sed -e 's/lua_static\b/lua_static2/' -e "s/127\.0\.0\.1:$LS;/127.0.0.1:$YS;/")
    server {
        listen 127.0.0.1:$S1;
        listen 127.0.0.1:$S2;
        listen 127.0.0.1:$S3;
        keepalive_requests 100000;
        location / { return 200 "ok\n"; }
    }
}
EOF
cat > "$P/load.conf" <<'EOF'
LOAD_MODULES
worker_processes 1;
pid logs-load/nginx.pid;
error_log logs-load/error.log crit;
events { worker_connections 4096; }
http {
    access_log off;
    lua_shared_dict load 1m;
    server {
        listen 127.0.0.1:LOADPORT;
        # /run?port=P&rate=R&seconds=S&tag=T: starts sending; /count?tag=T: "done code:n ..."
        location = /run {
            content_by_lua_block {
                local port, rate = tonumber(ngx.var.arg_port), tonumber(ngx.var.arg_rate)
                local seconds, tag = tonumber(ngx.var.arg_seconds), ngx.var.arg_tag
                local d = ngx.shared.load
                local function one(premature)
                    if premature then return end
                    local s = ngx.socket.tcp()
                    s:settimeout(10000)
                    local code = "connect"
                    if s:connect("127.0.0.1", port) then
                        s:send("GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
                        local line = s:receive("*l")
                        code = line and line:match("^HTTP/1%.%d (%d+)") or "read"
                        s:close()
                    end
                    d:incr(tag .. " " .. code, 1, 0)
                    d:incr(tag .. " done", 1, 0)
                end
                ngx.timer.at(0, function(premature)
                    if premature then return end
                    local t0 = ngx.now()
                    for i = 1, math.floor(rate * seconds) do
                        ngx.timer.at(0, one)
                        ngx.update_time()
                        local wait = t0 + i / rate - ngx.now()
                        if wait > 0 then ngx.sleep(wait) end
                    end
                end)
                ngx.say("started")
            }
        }
        location = /count {
            content_by_lua_block {
                local tag, out = ngx.var.arg_tag, {}
                for _, k in ipairs(ngx.shared.load:get_keys(0)) do
                    local t, what = k:match("^(%S+) (%S+)$")
                    if t == tag then out[#out + 1] = what .. ":" .. ngx.shared.load:get(k) end
                end
                table.sort(out)
                ngx.say(table.concat(out, " "))
            }
        }
    }
}
EOF
sed -i -e "s/LOADPORT/$LOAD/" -e "/LOAD_MODULES/{
r /dev/stdin
d
}" "$P/load.conf" <<< "$(nginx_load_modules)"
chmod -R a+rX "$T"
"$NGINX" -p "$P/" -c peers.conf || die "the peers did not start"
PIDS+=("$(cat "$P/logs-peers/nginx.pid")")
"$NGINX" -p "$P/" -c front.conf || die "the front did not start"
PIDS+=("$(cat "$P/logs-front/nginx.pid")")
"$NGINX" -p "$P/" -c load.conf || die "the load generator did not start"
PIDS+=("$(cat "$P/logs-load/nginx.pid")")
up() { curl -s -m 1 -o /dev/null "http://127.0.0.1:$F1/" && curl -s -m 1 -o /dev/null "http://127.0.0.1:$LOAD/count?tag=x"; }
wait_for 10 up || die "the fronts do not answer"

mode() { curl -s -m 5 "http://127.0.0.1:$CTL/control?port=$1&$2" > /dev/null; }
hits() { curl -s -m 5 "http://127.0.0.1:$CTL/control?port=$1" | sed -n 's/^hits=\([0-9]*\).*/\1/p'; }
checks() { curl -s -m 5 "http://127.0.0.1:$CTL/control?port=$1" | sed -n 's/.* checks=\([0-9]*\).*/\1/p'; }
load() { curl -s -m 5 "http://127.0.0.1:$LOAD/run?port=$1&rate=$RATE&seconds=$2&tag=$3" > /dev/null; }
counts() { curl -s -m 5 "http://127.0.0.1:$LOAD/count?tag=$1"; }
errors_of() { tr ' ' '\n' <<< "$1" | awk -F: '$1 != "done" && $1 != "200" { n += $2 } END { print n + 0 }'; }
done_of() { tr ' ' '\n' <<< "$1" | awk -F: '$1 == "done" { print $2 }'; }
us() { echo "${EPOCHREALTIME/./}"; }

echo "bench-nginx: $(date -u +%Y-%m-%dT%H:%MZ), nginx $("$NGINX" -v 2>&1 | cut -d/ -f2), $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg), front workers $([ "${AFFINITY:-0}" = 1 ] && echo "pinned (AFFINITY=1)" || echo "not pinned")"
echo
SIDES="fuse:$F1:$A1:$B1:$C1 nginx:$F2:$A2:$B2:$C2 fuse5:$F3:$A3:$B3:$C3 fuse6:$F4:$A4:$B4:$C4 fusec:$F5:$A5:$B5:$C5"
for s in $SIDES; do IFS=: read -r _ _ a b c <<< "$s"; for p in $a $b $c; do mode "$p" 'mode=ok&reset=1'; done; done

if [ "${FAILURES:-1}" = 1 ]; then   # FAILURES=0: part 3 only
echo "1. outage: $RATE requests/s to each side at once; 5 s healthy, B $SICK_AS for $OUTAGE s, then heals"
total=$((5 + OUTAGE + 50))
for s in $SIDES; do IFS=: read -r name front _ <<< "$s"; load "$front" "$total" "out-$name"; done
sleep 5
for s in $SIDES; do IFS=: read -r _ _ _ b _ <<< "$s"; mode "$b" "mode=$OUTAGE_MODE&delay=$OUTAGE_DELAY&reset=1"; done
t_out=$(us)
# the heal falls at a random point (0 to 10 s past OUTAGE, the same for every side), so
# that the figure is not the phase of one fixed probe schedule against the heal
OFF=${HEAL_OFFSET_MS:-$((RANDOM % 10000))}
sleep "$(printf '%d.%03d' $((OUTAGE + OFF / 1000)) $((OFF % 1000)))"
declare -A SICK BACK ARR CHK
t_heal=$(us)
for s in $SIDES; do
  IFS=: read -r name _ _ b _ <<< "$s"
  SICK[$name]=$(hits "$b") CHK[$name]=$(checks "$b") ARR[$name]=$(curl -s -m 5 "http://127.0.0.1:$CTL/control?port=$b&arrivals=1")
  mode "$b" 'mode=ok&reset=1'
done
while :; do   # B of each side answers again: poll its hits every 50 ms (40 s max)
  left=0
  for s in $SIDES; do
    IFS=: read -r name _ _ b _ <<< "$s"
    [ -n "${BACK[$name]:-}" ] && continue
    if [ "$(hits "$b")" -gt 0 ]; then BACK[$name]=$(( ($(us) - t_heal) / 1000 )); else left=1; fi
  done
  [ $left = 0 ] && break
  [ $(( $(us) - t_heal )) -gt 40000000 ] && break
  sleep 0.05
done
for s in $SIDES; do IFS=: read -r name _ <<< "$s"; wait_for 60 sh -c "[ \"\$(curl -s 'http://127.0.0.1:$LOAD/count?tag=out-$name' | tr ' ' '\n' | sed -n 's/^done://p')\" = $((RATE * total)) ]"; done
# The mean wait for a heal anywhere from 15 s into the outage to the heal, from the times
# B's requests arrived (its probes) and the one after the heal: (1 / L) * the integral of
# (next probe - u) du over that span, so that one run gives the average over heals spread
# evenly, not the phase of one heal against one probe schedule.
mean_wait() { # mean_wait ARRIVALS BACK_MS: seconds
  awk -v from="$(( t_out + 15000000 ))" -v heal="$t_heal" -v back="$2" '
    BEGIN { RS = " "; from /= 1e6; heal /= 1e6 }
    /^\+/ { t = substr($0, 2) + 0; if (t > from) p[++n] = t }
    END {
      p[++n] = heal + back / 1000; a = from; sum = 0
      for (i = 1; i <= n; i++) {
        r = (p[i] < heal) ? p[i] : heal
        if (r > a) sum += ((p[i] - a) ^ 2 - (p[i] - r) ^ 2) / 2
        if (p[i] > a) a = p[i]
      }
      printf "%.2f", sum / (heal - from)
    }' <<< "$1"
}
printf '   %-7s %10s %16s %12s %14s %18s %16s\n' side requests "reached sick B" "checks to B" "client errors" \
  "B back after (s)" "mean wait (s)"
for s in $SIDES; do
  IFS=: read -r name _ <<< "$s"
  c=$(counts "out-$name")
  b=${BACK[$name]:-}
  printf '   %-7s %10s %16s %12s %14s %18s %16s\n' "$name" "$(done_of "$c")" "${SICK[$name]}" "${CHK[$name]}" "$(errors_of "$c")" \
    "$([ -n "$b" ] && printf '%d.%03d' $((b / 1000)) $((b % 1000)) || echo '>40')" \
    "$([ -n "$b" ] && mean_wait "${ARR[$name]}" "$b" || echo '-')"
done
echo "   (healed $OUTAGE s + $OFF ms after the outage began; fuse: backoff = 2, max_open_for = $MAX_OPEN_FOR; nginx: max_fails=3 fail_timeout=5s, zone; fuse5: no backoff; fuse6: backoff = 2, max_open_for = 6; fusec: max_open_for = 5 and check = { path = \"/health\", interval = 0.25 })"
echo "   (reached sick B: client requests; checks to B: the pool's checks, apart; mean wait: for a heal anywhere from"
echo "   15 s into the outage to the heal, from B's arrivals, checks included)"

echo
echo "2. two sick peers of three: B and C answer 500 for 20 s at $RATE requests/s, tries 2 on every side"
for s in $SIDES; do IFS=: read -r _ _ a b c <<< "$s"; for p in $a $b $c; do mode "$p" 'mode=ok&reset=1'; done; done
sleep 6   # every breaker closed again (open periods over), nginx's fail_timeout past
for s in $SIDES; do IFS=: read -r _ _ _ b c <<< "$s"; mode "$b" 'mode=fail&reset=1'; mode "$c" 'mode=fail&reset=1'; done
for s in $SIDES; do IFS=: read -r name front _ <<< "$s"; load "$front" 20 "two-$name"; done
for s in $SIDES; do IFS=: read -r name _ <<< "$s"; wait_for 60 sh -c "[ \"\$(curl -s 'http://127.0.0.1:$LOAD/count?tag=two-$name' | tr ' ' '\n' | sed -n 's/^done://p')\" = $((RATE * 20)) ]"; done
printf '   %-7s %10s %14s %14s\n' side requests "client errors" "reached B + C"
for s in $SIDES; do
  IFS=: read -r name _ _ b c <<< "$s"
  co=$(counts "two-$name")
  printf '   %-7s %10s %14s %14s\n' "$name" "$(done_of "$co")" "$(errors_of "$co")" "$(( $(hits "$b") + $(hits "$c") ))"
done
for s in $SIDES; do IFS=: read -r _ _ a b c <<< "$s"; for p in $a $b $c; do mode "$p" 'mode=ok&reset=1'; done; done

fi
[ "${THROUGHPUT:-1}" = 1 ] || exit 0   # THROUGHPUT=0: parts 1 and 2 only
echo
echo "3. throughput, every peer healthy: $ROUNDS rounds of 2 s wrk (16 connections) per balancer,"
echo "   in rotating order, three static peers (return 200), keepalive"
for port in $FS $RS $LS $XS $YS; do wrk -t 2 -c 16 -d 2s "http://127.0.0.1:$port/" > /dev/null 2>&1; done  # warm-up
FRONT_WORKERS=$(workers "${PIDS[1]}" | tr '\n' ' ')
ticks() { # CPU time of the front nginx's workers (clock ticks): "user+system user"
  local t=0 u=0 w
  for w in $FRONT_WORKERS; do
    t=$((t + $(awk '{ print $14 + $15 }' "/proc/$w/stat"))) u=$((u + $(awk '{ print $14 }' "/proc/$w/stat")))
  done
  echo "$t $u"
}
HZ=$(getconf CLK_TCK)
rps() { # rps PORT: "requests/s CPU-us/request user-space-CPU-us/request" of one round
  local t0 t1 u0 u1 out n r
  read -r t0 u0 <<< "$(ticks)"
  out=$(wrk -t 2 -c 16 -d 2s "http://127.0.0.1:$1/" 2>&1)
  read -r t1 u1 <<< "$(ticks)"
  n=$(awk '/requests in/ { print $1 }' <<< "$out") r=$(awk '/Requests\/sec/ { print $2 }' <<< "$out")
  echo "$r $(echo "($t1 - $t0) * 1000000 / $HZ / $n" | bc -l) $(echo "($u1 - $u0) * 1000000 / $HZ / $n" | bc -l)"
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# interval: the rounds' values in, "lo-hi" out: the k-th lowest and k-th highest, k the
# largest with P(Binomial(n, 1/2) < k) <= 2.5%, an interval that holds the median of the
# rounds' distribution 95% of the time or more whatever that distribution (n >= 6)
interval() {
  tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END {
    n = NR; term = 0.5 ^ n; cum = term; k = 0
    while (2 * cum <= 0.05) { k++; term *= (n - k + 1) / k; cum += term }
    if (k == 0) print "(too few rounds)"; else printf "%.3f-%.3f", a[k], a[n + 1 - k] }'
}
f_all="" r_all="" l_all="" qr_all="" ql_all="" fu_all="" ru_all="" lu_all="" x_all="" xu_all="" qx_all=""
fus_all="" lus_all="" qy_all=""
for i in $(seq "$ROUNDS"); do
  case $((i % 5)) in
    1) order="f r l x y" ;; 2) order="r l x y f" ;; 3) order="l x y f r" ;; 4) order="x y f r l" ;; 0) order="y f r l x" ;;
  esac
  for side in $order; do
    case $side in
      f) read -r f fu fus <<< "$(rps "$FS")" ;;
      r) read -r r ru _ <<< "$(rps "$RS")" ;;
      l) read -r l lu lus <<< "$(rps "$LS")" ;;
      x) read -r x xu _ <<< "$(rps "$XS")" ;;
      y) read -r y _ _ <<< "$(rps "$YS")" ;;
    esac
  done
  qr=$(echo "$f / $r" | bc -l) ql=$(echo "$f / $l" | bc -l) qx=$(echo "$f / $x" | bc -l) qy=$(echo "$y / $l" | bc -l)
  qy_all="$qy_all $qy"
  x_all="$x_all $x" xu_all="$xu_all $xu" qx_all="$qx_all $qx"
  f_all="$f_all $f" r_all="$r_all $r" l_all="$l_all $l" qr_all="$qr_all $qr" ql_all="$ql_all $ql"
  fu_all="$fu_all $fu" ru_all="$ru_all $ru" lu_all="$lu_all $lu" fus_all="$fus_all $fus" lus_all="$lus_all $lus"
  printf '   round %d: fuse %6.0f req/s %4.1f us | rr %6.0f %4.1f us | floor %6.0f %4.1f us | floor+ctx %6.0f %4.1f us | fuse/rr %.3f /floor %.3f /floor+ctx %.3f | floor\x27/floor %.3f\n' \
    "$i" "$f" "$fu" "$r" "$ru" "$l" "$lu" "$x" "$xu" "$qr" "$ql" "$qx" "$qy"
done
fm=$(echo "$f_all" | median) rm=$(echo "$r_all" | median) lm=$(echo "$l_all" | median)
qr=$(echo "$qr_all" | median) ql=$(echo "$ql_all" | median) qx=$(echo "$qx_all" | median)
xm=$(echo "$x_all" | median) xum=$(echo "$xu_all" | median)
fum=$(echo "$fu_all" | median) rum=$(echo "$ru_all" | median) lum=$(echo "$lu_all" | median)
fusm=$(echo "$fus_all" | median) lusm=$(echo "$lus_all" | median)
lr=$(echo "$l_all $r_all" | awk -v l="$lm" -v r="$rm" '{ print l / r }')
printf '   medians: fuse.upstream %.0f req/s, round robin %.0f, Lua floor %.0f (floor/rr %.3f: the Lua phases alone cost %.1f%%)\n' \
  "$fm" "$rm" "$lm" "$lr" "$(echo "(1 - $lr) * 100" | bc -l)"
printf '   median ratios of the rounds: fuse/rr %.3f (target >= 0.95), fuse/floor %.3f (target >= 0.98), fuse/floor+ctx %.3f\n' "$qr" "$ql" "$qx"
echo "   95% intervals of those medians (from the rounds' order): fuse/rr $(echo "$qr_all" | interval), fuse/floor $(echo "$ql_all" | interval), floor'/floor $(echo "$qy_all" | interval)"
printf "   the bench's own error: floor'/floor %.3f (the same work on two fronts; its distance from 1 is how far a run's\n" "$(echo "$qy_all" | median)"
echo "   median ratios can stray without any difference between the fronts)"
printf '   front CPU per request (medians): fuse.upstream %.1f us, round robin %.1f us, Lua floor %.1f us, floor+ctx %.1f us (%.0f req/s)\n' \
  "$fum" "$rum" "$lum" "$xum" "$xm"
# nginx's own work in the kernel (sockets, epoll) is the same for the two fronts; what
# fuse.upstream adds is user-space work: its share of the floor's whole CPU per request
# says how far the Lua can move throughput when the front is what limits it
printf '   of which in user space: fuse.upstream %.2f us, Lua floor %.2f us; the difference is %.1f%% of the floor'"'"'s CPU per request\n' \
  "$fusm" "$lusm" "$(echo "($fusm - $lusm) * 100 / $lum" | bc -l)"
echo "   load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
