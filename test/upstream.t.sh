#!/usr/bin/env bash
# test/upstream.t.sh -- fuse.upstream in a real nginx (prints TAP).
#
# Three nginx instances in one temp prefix laid out like the repository (lua/,
# build/fuse/core.so, examples/nginx/), on free loopback ports, each stopped by its pid:
#   peers  examples/nginx/peers.conf: fake peers A B C (and a spare E) whose mode the
#          test switches (ok, 500, a status, hang, slow failure); a port nobody listens
#          on (D) gives refused connections
#   front  README's "Upstream peers" config, as printed (tools/readme-block upstream-nginx),
#          paths and ports replaced: pool "backend" over A B C, 4 workers
#   pools  test/upstream-pools.conf: the other pools (max_ejected, weights, slow, statuses,
#          refused, timeouts, probes = 2), 4 workers
# Needs nginx with the Lua module, lua-resty-core, curl, wrk (for the load phases). Under
# CI=true a missing tool fails the suite. A watchdog stops it after 240 s. KEEP=1 keeps
# the temp prefix.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
NGINX=$(nginx_bin)

# shellcheck source=test/lib/tap.sh
. "$ROOT/test/lib/tap.sh"   # ok, nok, diag, check, bail, skip, skip_all

echo "TAP version 13"
[ -x "$NGINX" ] || skip_all "nginx not installed"
nginx_has_lua || skip_all "the nginx Lua module is not installed"
[ -r /usr/share/lua/5.1/ngx/balancer.lua ] || skip_all "lua-resty-core (ngx.balancer) is not installed"
command -v curl >/dev/null || skip_all "curl not installed"
command -v wrk >/dev/null || skip_all "wrk not installed"
[ -r "$ROOT/build/fuse/core.so" ] || bail "build/fuse/core.so missing: run make first"

T=$(mktemp -d /tmp/fuse-upstream-test.XXXXXX) || bail "mktemp failed"
P=$T/examples/nginx
F=$T/front
PIDS=()
trap 'cleanup_nginx "${PIDS[@]}"' EXIT
watchdog 240

mkdir -p "$P/logs-peers" "$P/logs-pools" "$P/temp" "$F/logs"
copy_fuse "$T"
cp "$ROOT/examples/nginx/peers.lua" "$P/"

ports() {
  sed -e "s/127\.0\.0\.1:18088/127.0.0.1:$FRONT/g" -e "s/127\.0\.0\.1:18089/127.0.0.1:$POOLS/g" \
    -e "s/127\.0\.0\.1:18090/127.0.0.1:$CTL/g" -e "s/127\.0\.0\.1:18091/127.0.0.1:$A/g" \
    -e "s/127\.0\.0\.1:18092/127.0.0.1:$B/g" -e "s/127\.0\.0\.1:18093/127.0.0.1:$C/g" \
    -e "s/127\.0\.0\.1:18094/127.0.0.1:$E/g" -e "s/127\.0\.0\.1:18095/127.0.0.1:$D/g"
}
"$ROOT/tools/readme-block" upstream-nginx > "$T/readme.conf" || bail "README has no upstream-nginx block"
start() { # start NAME PREFIX CONF [GLOBALS]: 0, or 1 with the reason in START_ERR
  START_ERR=$("$NGINX" -p "$2/" -c "$3" ${4:+-g "$4"} 2>&1)
}
# Ten free ports in a row (front, pools, control, A, B, C, E, D closed); a port another
# process takes between the check and the bind: new ports, up to three times.
started=0
for attempt in 1 2 3; do
  BASE=$(pick_ports 10) || bail "no free ports"
  FRONT=$BASE POOLS=$((BASE + 1)) CTL=$((BASE + 2))
  A=$((BASE + 3)) B=$((BASE + 4)) C=$((BASE + 5)) E=$((BASE + 6)) D=$((BASE + 7))
  ports < "$ROOT/examples/nginx/peers.conf" > "$P/peers.conf"
  ports < "$ROOT/test/upstream-pools.conf" > "$P/pools.conf"
  ports < "$T/readme.conf" | sed -e "s#/path/to/fuse/#$T/#g" > "$F/nginx.conf"
  chmod -R a+rX "$T"
  PIDS=()
  if start peers "$P" peers.conf; then
    PIDS+=("$(cat "$P/logs-peers/nginx.pid")")
    if start front "$F" nginx.conf "pid logs/nginx.pid; error_log logs/error.log warn;"; then
      PIDS+=("$(cat "$F/logs/nginx.pid")")
      if start pools "$P" pools.conf; then
        PIDS+=("$(cat "$P/logs-pools/nginx.pid")")
        started=1
        break
      fi
    fi
  fi
  for pid in "${PIDS[@]}"; do stop_master "$pid"; done
  case $START_ERR in
    *"Address already in use"*)  # the failed start's [emerg] lines are not this run's errors
      diag "ports taken meanwhile, retrying"
      : > "$F/logs/error.log" 2>/dev/null; : > "$P/logs-pools/error.log" 2>/dev/null
      : > "$P/logs-peers/error.log" 2>/dev/null ;;
    *) break ;;
  esac
done
[ $started = 1 ] || bail "nginx did not start: $START_ERR"
for _ in $(seq 50); do
  curl -s -m 1 -o /dev/null "http://127.0.0.1:$FRONT/metrics" &&
    curl -s -m 1 -o /dev/null "http://127.0.0.1:$POOLS/metrics" &&
    curl -s -m 1 -o /dev/null "http://127.0.0.1:$CTL/control?port=$A" && break
  sleep 0.1
done
nw=$(ps -o pid= --ppid "${PIDS[1]}" | grep -c .)
check "README's config runs as printed: nginx with $nw workers (4)" [ "$nw" -eq 4 ]

# ---------------------------------------------------------------- helpers
# get PORT PATH: one request on a fresh connection; CODE, PEER (X-Peer), WPID, RA (Retry-After)
get() {
  local out
  out=$(curl -s -m 5 -H 'Connection: close' -o "$T/body" \
    -w '%{http_code}|%header{x-peer}|%header{x-worker-pid}|%header{retry-after}' "http://127.0.0.1:$1$2")
  IFS='|' read -r CODE PEER WPID RA <<< "$out"
  PEER=${PEER:-none}
}
mode() { curl -s -m 5 "http://127.0.0.1:$CTL/control?port=$1&$2" > /dev/null; } # mode PORT 'mode=fail&reset=1'
hits() { curl -s -m 5 "http://127.0.0.1:$CTL/control?port=$1" | sed -n 's/^hits=\([0-9]*\).*/\1/p'; }
maxc() { curl -s -m 5 "http://127.0.0.1:$CTL/control?port=$1" | sed -n 's/.* max=\([0-9]*\).*/\1/p'; }
allmode() { for p in $A $B $C $E; do mode "$p" "$1"; done; }
# metric PORT SERIES: the value of one series of /metrics
metric() {
  curl -s -m 5 "http://127.0.0.1:$1/metrics" | grep -F "$2 " | head -n 1 | awk '{ print $2 }'
}
state_of() { # state_of POOL ADDRPORT (front): the fuse_state value
  metric "$FRONT" "fuse_state{name=\"$1/127.0.0.1:$2\"}"
}
pstate() { curl -s -m 5 "http://127.0.0.1:$POOLS/state?name=$1"; }  # pools nginx: "state f s slow opens"
# seq_req PORT PATH N: N requests one after another (20 ms apart, so each one's log phase
# has reported before the next); CODES = "code count;..." , PEERS of each, WORKERS distinct
# (at most $4 seconds when given: SEQ_N tells how many were sent)
seq_req() {
  local i codes="" pids="" t0=$SECONDS
  SEQ_PEERS="" SEQ_N=0
  for i in $(seq "$3"); do
    [ -n "${4:-}" ] && [ $((SECONDS - t0)) -ge "$4" ] && break
    SEQ_N=$i
    get "$1" "$2"
    codes="$codes$CODE\n" pids="$pids$WPID\n" SEQ_PEERS="$SEQ_PEERS$PEER "
    sleep 0.02
  done
  CODES=$(printf "$codes" | sort | uniq -c | awk '{ printf "%s x%s;", $2, $1 }')
  WORKERS=$(printf "$pids" | grep . | sort -u | grep -c .)
}
# par PORT PATH N: N requests at once; PCODES as CODES
par() {
  rm -rf "$T/par"; mkdir -p "$T/par"
  curl -s --no-progress-meter -m 10 --parallel --parallel-immediate --parallel-max "$3" \
    -H 'Connection: close' -o "$T/par/b#1" -w '%{http_code} %header{x-worker-pid}\n' \
    "http://127.0.0.1:$1$2?i=[1-$3]" > "$T/par.out" 2> /dev/null
  par_read
}
par_read() {
  PCODES=$(cut -d' ' -f1 "$T/par.out" | sort | uniq -c | awk '{ printf "%s x%s;", $2, $1 }')
  PWORKERS=$(cut -d' ' -f2 "$T/par.out" | grep . | sort -u | grep -c .)
}

# ---------------------------------------------------------------- README pool "backend"
allmode 'mode=ok&reset=1'
seq_req "$FRONT" / 30
check "healthy: 30 requests all 200" [ "$CODES" = "200 x30;" ]
spread="$(hits $A)/$(hits $B)/$(hits $C)"
check "healthy: every peer got traffic (A/B/C hits $spread)" [ "$(hits $A)" -gt 0 ] && [ "$(hits $B)" -gt 0 ] && [ "$(hits $C)" -gt 0 ]

mode "$B" 'mode=fail&reset=1'
codes=""
for i in $(seq 30); do                      # until B has failed 3 times (at most 30 requests)
  get "$FRONT" /
  codes="$codes$CODE "
  [ "$(hits $B)" -ge 3 ] && break
  sleep 0.02
done
sleep 0.05                                  # the last failure's log phase has reported
check "B fails: clients see no error, a healthy peer takes the retry ($i requests: $codes)" \
  [ -z "$(echo $codes | tr -d '2 0')" ]
bh=$(hits $B)
check "B got exactly fails=3 failing requests across 4 workers (got $bh)" [ "$bh" = 3 ]
[ "$bh" = 3 ] || diag "$(curl -s "http://127.0.0.1:$FRONT/metrics" | grep "backend/127.0.0.1:$B")"
check "B's breaker backend/B is open" [ "$(state_of backend $B)" = 1 ]
seq_req "$FRONT" / 30 3                     # within B's open period (5 s)
check "while open every worker skips B: $SEQ_N more requests, B still at 3 hits ($(hits $B)), all 200" \
  [ "$(hits $B)" = 3 ] && [ "$CODES" = "200 x$SEQ_N;" ] && [ "$SEQ_N" -ge 10 ]

# Still sick, under concurrent load: at most probes=1 request at a time, one probe round per
# open period (open_for 5 s; each probe fails after 0.6 s).
mode "$B" 'mode=slowfail&delay=0.6&reset=1'
sleep 5.1
wrk -t 2 -c 16 -d 6s "http://127.0.0.1:$FRONT/" > "$T/wrk.out" 2>&1
bh=$(hits $B) bm=$(maxc $B)
reqs=$(awk '/requests in/ { print $1 }' "$T/wrk.out")
non2xx=$(awk '/Non-2xx/ { print $5 }' "$T/wrk.out"); non2xx=${non2xx:-0}
errs=$(grep -c 'Socket errors' "$T/wrk.out")
check "sick under load ($reqs requests in 6 s, 16 connections): B got $bh probes, at most 1 at a time (max $bm)" \
  [ "$bm" = 1 ]
check "one probe round per open period: $bh probes in 6 s with open_for 5 + 0.6 s probes (at most 2)" \
  [ "$bh" -ge 1 ] && [ "$bh" -le 2 ]
check "clients saw no error during the probes (non-2xx: $non2xx, socket errors: $errs)" \
  [ "$non2xx" = 0 ] && [ "$errs" = 0 ]
[ "$non2xx" = 0 ] && [ "$errs" = 0 ] || diag "$(cat "$T/wrk.out")"

mode "$B" 'mode=ok&reset=1'
sleep 5.1
seq_req "$FRONT" / 30
bh=$(hits $B)
check "healed: B is back in rotation after its open period ($bh of 30 requests)" [ "$bh" -ge 5 ]
check "healed: B's breaker closed" [ "$(state_of backend $B)" = 0 ]
check "healed: all 200 ($CODES)" [ "$CODES" = "200 x30;" ]

# set_peers: A is opened first (its state must stay), then the list becomes A C E.
mode "$A" 'mode=fail&reset=1'
seq_req "$FRONT" / 15
opensA=$(metric "$FRONT" "fuse_opens_total{name=\"backend/127.0.0.1:$A\"}")
check "A opened before the switch" [ "$(state_of backend $A)" = 1 ]
mode "$C" 'mode=hang&delay=0.5&reset=1'
par "$FRONT" / 40 &
parpid=$!
sleep 0.2                                   # requests in flight on C in every worker
out=$(curl -s -m 5 -d "[\"127.0.0.1:$A\", \"127.0.0.1:$C\", \"127.0.0.1:$E\"]" "http://127.0.0.1:$FRONT/peers")
wait "$parpid"
par_read
check "requests in flight while the list changed all ended 200 ($PCODES)" [ "$PCODES" = "200 x40;" ]
case $out in *"127.0.0.1:$E"*) ok "/peers answered the new list" ;; *) nok "/peers answered the new list"; diag "$out" ;; esac
sleep 0.5                                   # every worker's timer (0.2 s) has run
m=$(curl -s -m 5 "http://127.0.0.1:$FRONT/metrics")
if grep -q "backend/127.0.0.1:$B\"" <<< "$m"; then
  nok "set_peers removed B's breaker from the registry (fuse.remove)"
else ok "set_peers removed B's breaker from the registry (fuse.remove)"; fi
check "set_peers added E's breaker" grep -q "fuse_state{name=\"backend/127.0.0.1:$E\"} 0" <<< "$m"
# (A stays sick: under a slow machine its open period may end and a probe re-open it,
# so "kept" means not a fresh breaker: not closed, its opens and failures still counted)
opensA2=$(metric "$FRONT" "fuse_opens_total{name=\"backend/127.0.0.1:$A\"}")
failsA2=$(metric "$FRONT" "fuse_failures_total{name=\"backend/127.0.0.1:$A\"}")
stA2=$(state_of backend $A)
check "A stayed with its state (state $stA2 not closed, opens_total $opensA2 >= $opensA, failures $failsA2 >= 3)" \
  [ "$stA2" != 0 ] && [ "${opensA2:-0}" -ge "${opensA:-1}" ] && [ "${opensA:-0}" -ge 1 ] && [ "${failsA2:-0}" -ge 3 ]
allmode 'mode=ok&reset=1'
seq_req "$FRONT" / 30
check "after the switch every worker uses the new list: B 0 hits ($(hits $B)), E $(hits $E)" \
  [ "$(hits $B)" = 0 ] && [ "$(hits $E)" -gt 0 ]
curl -s -m 5 -d "[\"127.0.0.1:$A\", \"127.0.0.1:$B\", \"127.0.0.1:$C\"]" "http://127.0.0.1:$FRONT/peers" > /dev/null
code=$(curl -s -m 5 -o "$T/bad" -w '%{http_code}' -d '["nope"]' "http://127.0.0.1:$FRONT/peers")
check "/peers answers 400 for a bad peer ($(head -c 120 "$T/bad"))" [ "$code" = 400 ]
if command -v promtool >/dev/null; then
  curl -s -m 5 "http://127.0.0.1:$FRONT/metrics" > "$T/m.txt"
  check "front /metrics passes promtool check metrics" promtool check metrics < "$T/m.txt"
fi

# ---------------------------------------------------------------- pools nginx
# max_ejected = 1: every peer open -> 503 + Retry-After of the soonest (open_for 3)
allmode 'mode=fail&reset=1'
get "$POOLS" /p/ej1
first=$CODE
get "$POOLS" /p/ej1
check "max_ejected=1: the first request tried all 3 failing peers ($first), the next gets 503" \
  [ "$first" = 500 ] && [ "$CODE" = 503 ]
check "with Retry-After of the soonest peer, 1 to 3 s (got '$RA')" [ -n "$RA" ] && [ "$RA" -ge 1 ] && [ "$RA" -le 3 ]

# max_ejected = 0.5: every peer open, yet every request reaches a peer (panic picks)
get "$POOLS" /p/ej                          # trips A, B and C (fails = 1, three tries)
before=$(( $(hits $A) + $(hits $B) + $(hits $C) ))
seq_req "$POOLS" /p/ej 10
after=$(( $(hits $A) + $(hits $B) + $(hits $C) ))
pan=$(metric "$POOLS" 'fuse_upstream_panic_total{pool="ej"}')
check "max_ejected=0.5 keeps the pool: 10 requests, none 503 ($CODES), peers got $((after - before)) tries" \
  [ "$((after - before))" = 30 ] && ! grep -q 503 <<< "$CODES"
check "panic picks counted across $WORKERS workers: fuse_upstream_panic_total{pool=\"ej\"} = $pan (3 per request)" \
  [ "$pan" = 30 ] && [ "$WORKERS" -gt 1 ]

# weights 1:2
allmode 'mode=ok&reset=1'
seq_req "$POOLS" /p/w12 150
ha=$(hits $A) hb=$(hits $B)
d=$((3 * hb - 2 * 150)); d=${d#-}
check "weights 1:2 honoured: A $ha, B $hb of 150 (|3B - 2N| = $d <= 12, 4 workers)" [ "$d" -le 12 ]

# slow per try: A fails after 0.25 s (slow = 0.2), B answers at once
mode "$A" 'mode=slowfail&delay=0.25&reset=1'
seq_req "$POOLS" /p/slow 10
sa=$(pstate "slow/127.0.0.1:$A") sb=$(pstate "slow/127.0.0.1:$B")
read -r _ fa _ slowa _ <<< "$sa"; read -r _ _ okb slowb _ <<< "$sb"
check "slow applies per try: A's tries slow ($slowa of $fa failures), B's retries not ($slowb of $okb)" \
  [ "$slowa" -ge 1 ] && [ "$slowa" = "$fa" ] && [ "$slowb" = 0 ] && [ "$okb" -ge "$fa" ]
check "slow pool: clients all 200 ($CODES)" [ "$CODES" = "200 x10;" ]

# fail_statuses = { 500 }: a 503 is a success, a 500 a failure
mode "$A" 'mode=status&status=503&reset=1'
seq_req "$POOLS" /p/st 5
read -r _ f s _ <<< "$(pstate "st/127.0.0.1:$A")"
check "a status outside fail_statuses counts as success (503 x5: failures $f, successes $s)" \
  [ "$f" = 0 ] && [ "$s" = 5 ] && [ "$CODES" = "503 x5;" ]
mode "$A" 'mode=fail&reset=1'
seq_req "$POOLS" /p/st 2
read -r _ f _ <<< "$(pstate "st/127.0.0.1:$A")"
check "a status in fail_statuses counts as failure (500 x2: failures $f)" [ "$f" = 2 ]

# refused connections (D has no listener)
allmode 'mode=ok&reset=1'
seq_req "$POOLS" /p/refuse 10
read -r st f _ <<< "$(pstate "refuse/127.0.0.1:$D")"
check "refused connections count as failures: D failed $f times (fails=2) and is $st; clients $CODES" \
  [ "$f" = 2 ] && [ "$st" = open ] && [ "$CODES" = "200 x10;" ]

# timeouts (A hangs 1 s, proxy_read_timeout 300 ms)
mode "$A" 'mode=hang&delay=1&reset=1'
seq_req "$POOLS" /p/hang 10
read -r st f _ <<< "$(pstate "hang/127.0.0.1:$A")"
check "timeouts count as failures: A timed out $f times (fails=2) and is $st; clients $CODES" \
  [ "$f" = 2 ] && [ "$st" = open ] && [ "$CODES" = "200 x10;" ]

# probes = 2 at a time across workers, under concurrent requests
mode "$A" 'mode=slowfail&delay=0.6&reset=1'
seq_req "$POOLS" /p/pr 2                    # opens A (fails = 1)
mode "$A" 'mode=slowfail&delay=0.6&reset=1'
sleep 1.1
par "$POOLS" /p/pr 40
check "probes=2: 40 concurrent requests in $PWORKERS workers, A got $(hits $A) (2), at most $(maxc $A) at once" \
  [ "$(hits $A)" = 2 ] && [ "$(maxc $A)" = 2 ] && [ "$PWORKERS" -gt 1 ]
check "probes=2: every client got 200 ($PCODES)" [ "$PCODES" = "200 x40;" ]

if command -v promtool >/dev/null; then
  curl -s -m 5 "http://127.0.0.1:$POOLS/metrics" > "$T/m2.txt"
  check "pools /metrics (with fuse_upstream_panic_total) passes promtool check metrics" \
    promtool check metrics < "$T/m2.txt"
fi

# ---------------------------------------------------------------- logs
bad=$(grep -hE '\[(alert|crit|emerg)\]|lua entry thread aborted|runtime error|attempt to' \
  "$F/logs/error.log" "$P/logs-pools/error.log" "$P/logs-peers/error.log" 2>/dev/null)
check "no Lua error, [alert], [crit] or [emerg] in the error logs" [ -z "$bad" ]
[ -z "$bad" ] || diag "$(echo "$bad" | head -n 10)"

echo "1..$n"
[ "$failed" -eq 0 ]
