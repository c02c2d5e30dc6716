#!/usr/bin/env bash
# test/nginx.t.sh -- one breaker across every nginx worker (prints TAP).
#
# Starts examples/nginx/nginx.conf with 4 workers in a temp prefix (a copy of lua/,
# build/fuse/core.so and examples/nginx/, so that the workers, running as `nobody`, can
# read everything), talks to it over 127.0.0.1 on free ports, stops it by its pid.
# Needs nginx with the Lua module (Debian: libnginx-mod-http-lua). Talks HTTP with curl
# (>= 7.84, for %header) or, without it, with bash's /dev/tcp (NGINX_T_CLIENT=bash forces
# that); promtool is used when installed. Runs in about 10 s on an idle machine; a watchdog stops it after 300 s.
#
# Nothing here depends on how fast the machine is: the breakers run on a test clock that
# only this script moves (app.test_clock, installed in init_by_lua, moved with
# /__control?advance=S), every wait polls for its condition with a generous bound, and
# ports are checked free (no socket bound, nothing answering) and every answer is
# checked to come from this nginx's own workers (another nginx on the machine with
# `reuseport` on the same port would share it), else nginx restarts on other ports.
# KEEP=1 keeps the temp prefix (logs, rendered config) for a look afterwards.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
# shellcheck source=test/lib/tap.sh
. "$ROOT/test/lib/tap.sh"   # ok, nok, diag, check, bail, skip, skip_all
nginx_suite nginx
CLIENT=${NGINX_T_CLIENT:-curl}
if [ "$CLIENT" = curl ]; then
  v=$(curl --version 2>/dev/null | head -n 1 | cut -d' ' -f2)
  [ -n "$v" ] && [ "$(printf '%s\n' 7.84.0 "$v" | sort -V | head -n 1)" = 7.84.0 ] || CLIENT=bash
fi

# ---------------------------------------------------------------- setup
P=$T/examples/nginx
MASTER=
# stops nginx (the pid file's master when MASTER is not known yet), the watchdog
trap 'cleanup_nginx "${MASTER:-$(cat "$P/logs/nginx.pid" 2>/dev/null)}"' EXIT
watchdog 300

mkdir -p "$P/logs" "$P/temp"
copy_fuse "$T" "$LUA_SRC" "$SO_SRC"
cp "$ROOT/examples/nginx/app.lua" "$P/app.lua"
chmod -R a+rX "$T"        # workers run as nobody: they read lua/, build/ and app.lua

# The example's config on ports PORT (front), UP and PORT + 2, with the test clock
# installed in init_by_lua (before the fork, so every worker inherits it).
render_conf() {
  UP=$((PORT + 1))
  sed -e "s/127\.0\.0\.1:18080/127.0.0.1:$PORT/g" -e "s/127\.0\.0\.1:18081/127.0.0.1:$UP/g" \
    -e "s/127\.0\.0\.1:18082/127.0.0.1:$((PORT + 2))/g" \
    -e 's/^\([[:space:]]*\)require("app").setup()/\1fuse.clock(require("app").test_clock)\n&/' \
    "$ROOT/examples/nginx/nginx.conf" > "$P/nginx.conf"
  chmod a+r "$P/nginx.conf"
  grep -q 'fuse.clock(require("app").test_clock)' "$P/nginx.conf" ||
    bail "cannot install the test clock: no require(\"app\").setup() line in nginx.conf"
}

# Starts nginx on free ports; retries on other ports when a bind fails.
start_nginx() {
  start_rendered 3 render_conf "$P" || { diag "nginx did not start:" "$NGINX_START_ERR"; return 1; }
}

# hget PORT PATH BODYFILE: one GET on a fresh connection, the body into BODYFILE;
# prints "STATUS PID", PID from the X-Worker-Pid header.
if [ "$CLIENT" = curl ]; then
  hget() {
    curl -s -m 60 -H 'Connection: close' -o "$3" -w '%{http_code} %header{x-worker-pid}' \
      "http://127.0.0.1:$1$2"
  }
else
  hget() {
    local code pid
    # shellcheck disable=SC2016  # $0 and $1 expand in the inner bash
    timeout 60 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
      printf "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" "$1" >&3
      cat <&3' "$1" "$2" > "$3.raw" 2>/dev/null
    code=$(head -n 1 "$3.raw" | cut -d' ' -f2)
    pid=$(sed -n '1,/^\r$/p' "$3.raw" | tr -d '\r' | sed -n 's/^[Xx]-[Ww]orker-[Pp]id: *//p')
    sed '1,/^\r$/d' "$3.raw" > "$3"
    printf '%s %s' "${code:-000}" "$pid"
  }
fi

# req PATH -> sets CODE, WPID, BODY (one request on a fresh connection)
FOREIGN=""   # worker pids in answers that are not this nginx's workers
ours() { # ours PID: one of this nginx's workers (or no pid at all: no answer)
  [ -z "$1" ] || case " $WORKERS " in *" $1 "*) return 0 ;; *) return 1 ;; esac
}
req() {
  local out
  out=$(hget "$PORT" "$1" "$T/body")
  CODE=${out%% *}
  WPID=${out#* }
  BODY=$(cat "$T/body" 2>/dev/null)
  [ -z "${WORKERS:-}" ] || ours "$WPID" || FOREIGN="$FOREIGN $WPID"
}
advance() { fake "/__control?advance=$1" > /dev/null; } # moves the test clock
fake() { hget "$UP" "$1" "$T/fake.body" > /dev/null; cat "$T/fake.body"; } # fake upstream
hits() { fake /__hits | sed -n "s/.* $1=\([0-9]*\).*/\1/p"; } # hits of one mode
# field BREAKER FIELD JSON: a field of a /state answer
field() {
  printf '%s' "$3" | grep -o "\"$1\":{[^}]*}" | grep -o "\"$2\":[^,}]*" | cut -d: -f2 | tr -d '"'
}
# par N PATH: N requests at once (one connection each); "code pid" lines in $T/par.out
par() {
  rm -rf "$T/par"; mkdir -p "$T/par"
  if [ "$CLIENT" = curl ]; then
    curl -s --no-progress-meter -m 60 --parallel --parallel-immediate --parallel-max "$1" \
      -H 'Connection: close' -o "$T/par/b#1" -w '%{http_code} %header{x-worker-pid}\n' \
      "http://127.0.0.1:$PORT$2?i=[1-$1]" > "$T/par.out" 2> "$T/par.err"
  else
    local i jobs=()
    for i in $(seq "$1"); do
      { hget "$PORT" "$2?i=$i" "$T/par/b$i" > "$T/par/o$i"; echo >> "$T/par/o$i"; } &
      jobs+=("$!")
    done
    wait "${jobs[@]}"   # these jobs only: a bare wait would wait for the watchdog too
    cat "$T/par"/o* > "$T/par.out"
  fi
}

four_workers() { WORKERS=$(workers | sort -n | tr '\n' ' '); [ "$(echo "$WORKERS" | wc -w)" -eq 4 ]; }
answers() { req /state; [ "$CODE" = 200 ]; }
# 20 answers, every one from this nginx's workers: nobody else listens on PORT
only_ours() {
  local i
  FOREIGN=""
  for i in $(seq 20); do req /state; done
  [ -z "$FOREIGN" ]
}

started=0
for attempt in 1 2 3; do
  start_nginx || bail "cannot start nginx"
  MASTER=$(cat "$P/logs/nginx.pid" 2>/dev/null)
  WORKERS=""
  wait_for 30 answers || bail "nginx answers no request on port $PORT"
  wait_for 10 four_workers
  if only_ours; then started=1; break; fi
  diag "attempt $attempt: port $PORT is shared with another server (pids$FOREIGN): other ports"
  stop_master "$MASTER"
  MASTER=""
done
[ "$started" = 1 ] || bail "no port of our own after 3 attempts"
diag "HTTP client: $CLIENT" "ports $PORT (front) and $UP (fake upstream)"

nw=$(echo "$WORKERS" | wc -w)
check "nginx started, master $MASTER with 4 workers" [ "$nw" -eq 4 ]
[ "$nw" -eq 4 ] || diag "workers: $WORKERS"

# ---------------------------------------------------------------- (b) spread over workers
fake '/__control?mode=ok&reset=hits' > /dev/null
par 200 /api
codes=$(cut -d' ' -f1 "$T/par.out" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
pids=$(cut -d' ' -f2 "$T/par.out" | sort -u | grep -c .)
check "(b) 200 concurrent requests all answered 200" [ "$codes" = " 200 200;" ]
[ "$codes" = " 200 200;" ] || diag "status counts: $codes"
check "(b) more than one worker served them (X-Worker-Pid)" [ "$pids" -gt 1 ]
diag "$pids distinct worker pids served the 200 requests"
req /state
total=$(field upstream successes_total "$BODY")
check "(b) successes_total == 200 across workers (exact)" [ "${total:-x}" = 200 ]
[ "${total:-x}" = 200 ] || diag "successes_total: $total" "/state: $BODY"

# ---------------------------------------------------------------- (a) trip after `fails` hits
fake '/__control?mode=fail&reset=hits' > /dev/null
seq_codes="" seq_pids=""
for i in $(seq 12); do
  req /api
  seq_codes="$seq_codes$CODE "
  seq_pids="$seq_pids$WPID "
  [ "$i" -eq 12 ] && last_body=$BODY
done
fails_hit=$(hits fail)
apids=$(echo "$seq_pids" | tr ' ' '\n' | sort -u | grep -c .)
expect="502 502 502 503 503 503 503 503 503 503 503 503 "
check "(a) upstream hit exactly fails=3 times in total, not 3 per worker" [ "${fails_hit:-x}" = 3 ]
check "(a) 3 failures answered 502, then the fallback's 503" [ "$seq_codes" = "$expect" ]
if [ "${fails_hit:-x}" != 3 ] || [ "$seq_codes" != "$expect" ]; then
  diag "hits: $(fake /__hits)" "codes: $seq_codes" "pids: $seq_pids"
fi
check "(a) the 12 sequential requests reached more than one worker" [ "$apids" -gt 1 ]
diag "the 12 sequential requests were served by $apids distinct workers"
case $last_body in
  *"circuit 'upstream' is open"*) ok "(a) the 503 body says the circuit is open" ;;
  *) nok "(a) the 503 body says the circuit is open"; diag "body: $last_body" ;;
esac
req /state
st=$(field upstream state "$BODY")
check "(a) /state: upstream is open" [ "$st" = open ]
tot="$(field upstream failures_total "$BODY")/$(field upstream rejections_total "$BODY")"
check "(a) totals across workers: failures_total 3, rejections_total 9 (exact)" [ "$tot" = 3/9 ]
[ "$tot" = 3/9 ] || diag "failures_total/rejections_total: $tot"

# ---------------------------------------------------------------- (c) one probe at a time
# The fake upstream holds the probe until this script releases it: the state is read
# while the probe runs. The test clock stands still meanwhile, so the probe cannot time
# out, and the circuit, re-opened by the probe, stays open for the calls that arrive
# after it, however late.
fake '/__control?mode=hold&status=500&reset=hits' > /dev/null
advance 1.1                                 # open_for = 1 s has elapsed: next call probes
par 20 /api &
parpid=$!
held() { [ "$(hits hold)" -ge 1 ]; }
wait_for 30 held                            # the probe is running upstream
slow_mid=$(hits hold)
req /state
st_mid=$(field upstream state "$BODY")
fake '/__control?release=1' > /dev/null
wait "$parpid"
slow_hits=$(hits hold)
codes=$(cut -d' ' -f1 "$T/par.out" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
ppids=$(cut -d' ' -f2 "$T/par.out" | sort -u | grep -c .)
check "(c) 20 concurrent calls in half-open: exactly probes=1 reached the slow upstream" \
  [ "${slow_hits:-x}" = 1 ]
check "(c) while the probe ran: state half_open, 1 upstream hit" \
  [ "$st_mid/${slow_mid:-x}" = half_open/1 ]
check "(c) the probe failed (502), the other 19 got the fallback 503" \
  [ "$codes" = " 1 502; 19 503;" ]
if [ "${slow_hits:-x}" != 1 ] || [ "$codes" != " 1 502; 19 503;" ] || [ "$st_mid" != half_open ]; then
  diag "hits: $(fake /__hits)" "status counts: $codes" "state mid-probe: $st_mid ($slow_mid hits)"
fi
diag "$ppids distinct workers answered the 20 concurrent requests"
req /state
st=$(field upstream state "$BODY")
check "(c) the failed probe re-opened the circuit" [ "$st" = open ]

# ---------------------------------------------------------------- (d) recovery, seen by all
fake '/__control?mode=ok&reset=hits' > /dev/null
advance 1.1
req /api
check "(d) after open_for the probe goes through and succeeds (200)" [ "$CODE" = 200 ]
[ "$CODE" = 200 ] || diag "code $CODE body $BODY"
seen="" bad=""
for _ in $(seq 200); do
  req /state
  s=$(field upstream state "$BODY")
  [ "$s" = closed ] || bad="$bad $WPID:$s"
  case " $seen " in *" $WPID "*) ;; *) seen="$seen $WPID" ;; esac
  [ "$(echo "$seen" | wc -w)" -ge 4 ] && break
done
check "(d) all 4 workers answered /state" [ "$(echo "$seen" | wc -w)" -ge 4 ]
check "(d) every worker sees upstream closed" [ -z "$bad" ]
[ -z "$bad" ] || diag "not closed: $bad"
diag "workers seen: $seen (ps: $WORKERS)"
check "(d) upstream hit once (the probe)" [ "$(hits ok)" = 1 ]

# ---------------------------------------------------------------- (e) two-step form
fake '/__control?mode=fail&reset=hits' > /dev/null
seq_codes="" seq_pids=""
# counted I: the twostep breaker has seen I calls (reported, or rejected)
counted() {
  req /state
  local c r
  c=$(field twostep calls_total "$BODY") r=$(field twostep rejections_total "$BODY")
  [ "$((${c:-0} + ${r:-0}))" -ge "$1" ]
}
for i in $(seq 10); do
  req /twostep
  seq_codes="$seq_codes$CODE "
  seq_pids="$seq_pids$WPID "
  [ "$i" -eq 10 ] && last_body=$BODY
  # report runs in the log phase, just after the response is sent: wait for it
  wait_for 10 counted "$i" || diag "request $i to /twostep was not counted within 10 s"
done
fails_hit=$(hits fail)
expect="500 500 500 503 503 503 503 503 503 503 "
check "(e) two-step: upstream hit exactly fails=3 times in total" [ "${fails_hit:-x}" = 3 ]
check "(e) two-step: 3 x 500 passed through, then 503 from the access phase" \
  [ "$seq_codes" = "$expect" ]
if [ "${fails_hit:-x}" != 3 ] || [ "$seq_codes" != "$expect" ]; then
  diag "hits: $(fake /__hits)" "codes: $seq_codes" "pids: $seq_pids" "last body: $last_body"
fi
req /state
both="$(field twostep state "$BODY")/$(field upstream state "$BODY")"
check "(e) /state: twostep open, upstream still closed" [ "$both" = open/closed ]
[ "$both" = open/closed ] || diag "twostep/upstream: $both"

# ---------------------------------------------------------------- (f) metrics
req /metrics
printf '%s\n' "$BODY" > "$T/metrics.txt"
named=0
grep -q '"upstream"' "$T/metrics.txt" && grep -q '"twostep"' "$T/metrics.txt" && named=1
check "(f) /metrics answers 200 and names both breakers" [ "$CODE/$named" = 200/1 ]
if command -v promtool >/dev/null; then
  if out=$(promtool check metrics < "$T/metrics.txt" 2>&1); then
    ok "(f) promtool check metrics"
  else
    nok "(f) promtool check metrics"; diag "$out" "--- /metrics:" "$(head -n 40 "$T/metrics.txt")"
  fi
elif [ "${CI:-}" = true ]; then
  nok "(f) promtool check metrics (cannot run under CI: promtool not installed)"
else
  ok "(f) promtool check metrics # SKIP promtool not installed"
fi

# ---------------------------------------------------------------- every answer from our nginx
check "every answer came from this nginx's workers" [ -z "$FOREIGN" ]
[ -z "$FOREIGN" ] || diag "answers from other processes (another nginx on port $PORT?):$FOREIGN"

# ---------------------------------------------------------------- (g) error log
log_clean "$P/logs/error.log" "(g) no [error], [alert], [crit] or [emerg] in the error log"

echo "1..$n"
[ "$failed" -eq 0 ]
