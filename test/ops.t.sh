#!/usr/bin/env bash
# test/ops.t.sh -- operating fuse under a real nginx with 4 workers and a real Prometheus
# (prints TAP).
#
# Starts examples/nginx/nginx.conf in a temp prefix (as test/nginx.t.sh does), with
# README's admin listener and docs/operations.md's watch block put in place of the example's (between the
# "# -- begin/end" markers), on free loopback ports; then a Prometheus (1 s scrape and
# evaluation, examples/prometheus/fuse-alerts.yml loaded) scraping the admin listener's
# /metrics, with temp storage. Checks the admin endpoint and its errors, a timed
# force-open seen by every worker (fuse.reject, Retry-After) and lifted on time, watch
# delivering a transition to all 4 workers, and fuse_state / FuseCircuitOpen in
# Prometheus. Stops both by pid. Needs nginx with the Lua module, curl, luajit with
# lua-cjson and prometheus; without one it skips, except under CI=true, where it fails.
# About 20 s; a watchdog stops it after 180 s. KEEP=1 keeps the temp prefix.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
# shellcheck source=test/lib/tap.sh
. "$ROOT/test/lib/tap.sh"   # ok, nok, diag, check, bail, skip, skip_all
PROMETHEUS=${PROMETHEUS:-prometheus}
LUAJIT=${LUAJIT:-luajit}
nginx_suite ops curl prometheus cjson

# ---------------------------------------------------------------- setup
P=$T/examples/nginx
MASTER= PROM=
trap 'stop_pid "$PROM" TERM; cleanup_nginx "${MASTER:-$(cat "$P/logs/nginx.pid" 2>/dev/null)}"' EXIT
watchdog 180

mkdir -p "$P/logs" "$P/temp" "$T/prom"
copy_fuse "$T" "$LUA_SRC" "$SO_SRC"
cp "$ROOT/examples/nginx/app.lua" "$P/app.lua"
chmod -R a+rX "$T"

# the blocks, as printed: README's admin listener (port 9145), docs/operations.md's watch, curls, reject
"$ROOT/tools/readme-block" admin-listener > "$T/admin.block" || bail "README has no admin-listener block"
"$ROOT/tools/readme-block" watch "$ROOT/docs/operations.md" > "$T/watch.block" || bail "docs/operations.md has no watch block"
"$ROOT/tools/readme-block" admin-curl "$ROOT/docs/operations.md" > "$T/curl.block" || bail "docs/operations.md has no admin-curl block"
"$ROOT/tools/readme-block" reject "$ROOT/docs/operations.md" > "$T/reject.block" || bail "docs/operations.md has no reject block"
# the token README's admin listener is configured with (a POST needs it)
TOKEN=$(sed -n 's/.*admin{ token = "\([^"]*\)" }.*/\1/p' "$T/admin.block")
[ -n "$TOKEN" ] || bail "README's admin-listener block has no fuse.admin{ token = \"...\" }"

# put FILE in place of the lines between "# -- begin NAME" and "# -- end NAME"
splice() { # splice NAME FILE < conf > conf
  awk -v name="$1" -v file="$2" '
    $0 ~ "# -- begin " name "$" { print; while ((getline l < file) > 0) print l; skip = 1; next }
    $0 ~ "# -- end " name "$" { skip = 0 }
    !skip' 
}

render_conf() { # ports PORT .. PORT + 3: front, fake upstream, admin, Prometheus
  UP=$((PORT + 1)) ADMIN=$((PORT + 2)) PPORT=$((PORT + 3))
  splice admin "$T/admin.block" < "$ROOT/examples/nginx/nginx.conf" | splice watch "$T/watch.block" |
    sed -e "s/127\.0\.0\.1:18080/127.0.0.1:$PORT/g" -e "s/127\.0\.0\.1:18081/127.0.0.1:$UP/g" \
        -e "s/127\.0\.0\.1:9145/127.0.0.1:$ADMIN/g" > "$P/nginx.conf"
  chmod a+r "$P/nginx.conf"
}
start_nginx() {
  start_rendered 4 render_conf "$P" || { diag "nginx did not start:" "$NGINX_START_ERR"; return 1; }
}

# req PORT PATH [curl args...] -> CODE, WPID, RA (Retry-After), BODY
req() {
  local port=$1 path=$2 out; shift 2
  out=$(curl -s -m 5 -H 'Connection: close' -o "$T/body" \
    -w '%{http_code} %header{x-worker-pid} %header{retry-after}' "$@" "http://127.0.0.1:$port$path")
  read -r CODE WPID RA <<< "$out"
  BODY=$(cat "$T/body" 2>/dev/null)
}
admin() { req "$ADMIN" /fuse -H "Authorization: Bearer $TOKEN" "$@"; }
fake() { curl -s -m 5 "http://127.0.0.1:$UP$1" > /dev/null; }
# json EXPR: evaluates the Lua expression EXPR over `j`, BODY decoded as JSON
json() {
  printf '%s' "$BODY" | EXPR=$1 "$LUAJIT" -e '
    local cjson = require "cjson.safe"
    local j = cjson.decode(io.read("*a"))
    local function find(name)
      for _, b in ipairs(j and j.breakers or {}) do if b.name == name then return b end end
    end
    local ok, v = pcall(assert(loadstring("local j, find = ...; return " .. os.getenv("EXPR"))), j, find)
    print(ok and tostring(v) or "error: " .. tostring(v))'
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
within() { awk -v a="$2" -v b="$(now)" -v l="$1" 'BEGIN { exit !(b - a < l) }'; } # within SECS SINCE

start_nginx || bail "cannot start nginx"
MASTER=$(cat "$P/logs/nginx.pid" 2>/dev/null)
for _ in $(seq 50); do admin; [ "$CODE" = 200 ] && break; sleep 0.1; done
WORKERS=$(ps -o pid= --ppid "$MASTER" | tr -d ' ' | sort -n | tr '\n' ' ')
check "nginx started with README's admin listener and the watch block (docs/operations.md), 4 workers" \
  [ "$(echo "$WORKERS" | wc -w)" -eq 4 ]

# Prometheus, started now so that it is up when the checks below need it.
cp "$ROOT/examples/prometheus/fuse-alerts.yml" "$T/prom/"
cat > "$T/prom/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - fuse-alerts.yml
scrape_configs:
  - job_name: fuse
    static_configs:
      - targets: ["127.0.0.1:$ADMIN"]
EOF
"$PROMETHEUS" --config.file="$T/prom/prometheus.yml" --storage.tsdb.path="$T/prom/data" \
  --web.listen-address="127.0.0.1:$PPORT" > "$T/prom/prometheus.log" 2>&1 &
PROM=$!

# ---------------------------------------------------------------- docs/operations.md's blocks
ok=1
while IFS= read -r line; do
  [ -z "$line" ] && continue
  grep -qF -- "$(echo "$line" | sed 's/^ *//')" "$ROOT/examples/nginx/nginx.conf" || { ok=0; diag "not in the example: $line"; }
done < "$T/reject.block"
check "docs/operations.md's fuse.reject lines are the example's /twostep access phase, which runs below" [ $ok = 1 ]
out=$(sed "s/127\.0\.0\.1:9145/127.0.0.1:$ADMIN/g" "$T/curl.block" | bash 2>&1)
case $out in
  *'"breakers":['*'"state":"forced_open"'*'"state":"closed"'*) ok "docs/operations.md's admin curl commands run: list, force_open, reset" ;;
  *) nok "docs/operations.md's admin curl commands run: list, force_open, reset"; diag "$out" ;;
esac

# ---------------------------------------------------------------- admin: GET and POST
admin
check "admin GET: 200, JSON listing upstream and twostep with state, retry_after, counts, totals" \
  [ "$CODE/$(json 'find("upstream").state .. "," .. find("twostep").state .. "," .. find("twostep").retry_after .. "," .. find("twostep").calls .. "," .. find("twostep").calls_total .. "," .. #j.breakers')" \
    = "200/closed,closed,0,0,0,2" ]
admin -d 'name=upstream&action=disable'
check "admin POST disable: 200 and the breaker's new JSON" \
  [ "$CODE/$(json 'j.name .. ":" .. j.state')" = "200/upstream:disabled" ]
admin -d 'name=upstream&action=reset'
check "admin POST reset: 200, closed" [ "$CODE/$(json 'j.state')" = "200/closed" ]
errs_ok=1
while read -r want form; do
  admin -d "$form"
  e=$(json 'type(j.error) == "string" and #j.error > 0')
  if [ "$CODE/$e" != "$want/true" ]; then errs_ok=0; diag "POST $form -> $CODE $BODY (want $want)"; fi
done <<'EOF'
400 action=reset
400 name=upstream
400 name=upstream&action=explode
400 name=upstream&action=force_open&seconds=abc
400 name=upstream&action=force_open&seconds=-5
400 name=upstream&action=force_open&seconds=0
400 name=upstream&action=reset&seconds=5
404 name=no-such-breaker&action=reset
EOF
check "admin POST errors: 400 for a bad request, 404 for an unknown name, each with a JSON error" [ $errs_ok = 1 ]
admin -X PUT
check "admin PUT: 405 with a JSON error" [ "$CODE/$(json 'type(j.error)')" = "405/string" ]
admin
check "no request with an error changed a breaker" \
  [ "$(json 'find("upstream").state .. find("twostep").state')" = closedclosed ]

# ---------------------------------------------------------------- timed force-open
fake '/__control?mode=ok&reset=hits'
# The admin curls above made two transitions of twostep (closed -> forced_open, then
# forced_open -> closed), which each worker's watch logs at its next poll. The watch
# checks below read the log from LOGSTART: set it only once every worker has logged the
# second one (a watch delivers in order, so the first came before), or a late poll of
# those transitions is read as a double delivery of the one made below.
logged_by() { # FROM PATTERN: the pids that logged "fuse: breaker twostep: PATTERN" after line FROM
  tail -n "+$(($1 + 1))" "$P/logs/error.log" | grep -F "fuse: breaker twostep: $2" |
    sed -n 's/.*\[warn\] \([0-9]*\)#.*/\1/p' | sort -n
}
for _ in $(seq 400); do
  [ "$(logged_by 0 "forced_open -> closed" | sort -u | wc -l)" -ge 4 ] && break
  sleep 0.05
done
check "watch: all 4 workers heard the admin curls (closed -> forced_open -> closed), once each" \
  [ "$(logged_by 0 "closed -> forced_open" | tr '\n' ' ')/$(logged_by 0 "forced_open -> closed" | tr '\n' ' ')" \
    = "$WORKERS/$WORKERS" ]
LOGSTART=$(wc -l < "$P/logs/error.log")   # watch checks read the log from here
SECS=6   # long enough to reach all 4 workers on a loaded machine
t0=$(now)
admin -d "name=twostep&action=force_open&seconds=$SECS"
check "admin POST force_open seconds=$SECS: 200, forced_open, retry_after in ($((SECS - 1)), $SECS]" \
  [ "$CODE/$(json 'j.state .. "," .. tostring(j.retry_after > '$SECS' - 1 and j.retry_after <= '$SECS')')" = "200/forced_open,true" ]
seen="" bad=""
for _ in $(seq 200); do
  [ "$(echo "$seen" | wc -w)" -ge 4 ] && break
  within $((SECS - 1)) "$t0" || break
  req "$PORT" /twostep
  case "$CODE $RA $BODY" in
    "503 "[1-6]" fuse: circuit 'twostep' is open") ;;
    *) within $((SECS - 1)) "$t0" && bad="$bad [$WPID: $CODE RA=$RA $BODY]" ;;
  esac
  case " $seen " in *" $WPID "*) ;; *) seen="$seen $WPID" ;; esac
done
# (a function: `check DESC [ a ] && [ b ]` would check [ a ] alone, the && being the caller's)
all_rejected() { [ "$(echo "$seen" | wc -w)" -ge 4 ] && [ -z "$bad" ]; }
check "every worker (4) rejects during the force-open: fuse.reject's 503, Retry-After 1-$SECS, its text" \
  all_rejected
[ -z "$bad" ] || diag "unexpected:$bad"
[ "$(echo "$seen" | wc -w)" -ge 4 ] || diag "workers seen rejecting: $seen"
first200= lifted_at=
for _ in $(seq 400); do
  req "$PORT" /twostep
  if [ "$CODE" = 200 ]; then first200=$(elapsed "$t0"); break; fi
  sleep 0.05
  within 30 "$t0" || break
done
diag "first 200 at ${first200:-never} s after the force-open of $SECS s"
lifted_on_time() { [ -n "$first200" ] && awk -v t="${first200:-0}" -v s="$SECS" 'BEGIN { exit !(t >= s) }'; }
check "lifted on time: the first call let through came after $SECS s (and within 30 s)" lifted_on_time
admin
check "after the probe succeeded, twostep is closed" [ "$(json 'find("twostep").state')" = closed ]

# ---------------------------------------------------------------- watch in every worker
# The watch block (docs/operations.md) logs "fuse: breaker NAME: FROM -> TO" at [warn] in each worker.
watched() { logged_by "$LOGSTART" "$1"; } # the pids that logged this transition, one line each
for _ in $(seq 100); do
  [ "$(watched "forced_open -> open" | sort -u | wc -l)" -ge 4 ] && break
  sleep 0.1
done
pids=$(watched "closed -> forced_open" | tr '\n' ' ')
check "watch: all 4 workers heard closed -> forced_open, once each" [ "$pids" = "$WORKERS" ]
[ "$pids" = "$WORKERS" ] || diag "logged by: $pids; workers: $WORKERS"
pids=$(watched "forced_open -> open" | tr '\n' ' ')
check "watch: all 4 workers heard the lift forced_open -> open, once each" [ "$pids" = "$WORKERS" ]
# one new transition, timed: the disable below reaches every worker
t1=$(now)
admin -d 'name=twostep&action=disable'
for _ in $(seq 200); do
  [ "$(watched "closed -> disabled" | wc -l)" -ge 4 ] && break
  sleep 0.05
done
took=$(elapsed "$t1")
pids=$(watched "closed -> disabled" | tr '\n' ' ')
check "watch: one transition (closed -> disabled) delivered to all 4 workers" [ "$pids" = "$WORKERS" ]
diag "all 4 workers logged it within $took s (polled every 0.5 s)"
admin -d 'name=twostep&action=reset'

# ---------------------------------------------------------------- Prometheus
prom() { # prom PATH: GET from Prometheus' HTTP API into BODY
  BODY=$(curl -s -m 5 "http://127.0.0.1:$PPORT$1")
}
for _ in $(seq 150); do
  prom /api/v1/rules
  case $BODY in *FuseBreakerFull*) break ;; esac
  sleep 0.1
done
check "Prometheus is up with fuse-alerts.yml loaded (FuseCircuitOpen, FuseCircuitFlapping, FuseBreakerFull)" \
  [ "$(json '#j.data.groups[1].rules')" = 3 ]
# trip twostep: 3 failures (open_for 30 s)
fake '/__control?mode=fail&reset=hits'
for _ in 1 2 3; do req "$PORT" /twostep; sleep 0.05; done
admin
check "twostep is open after 3 failures" [ "$(json 'find("twostep").state')" = open ]
value=
for _ in $(seq 100); do
  prom '/api/v1/query?query=fuse_state%7Bname%3D%22twostep%22%7D'
  value=$(json 'j.data.result[1] and j.data.result[1].value[2]')
  [ "$value" = 1 ] && break
  sleep 0.2
done
check "Prometheus reads fuse_state{name=\"twostep\"} == 1 while the circuit is open" [ "$value" = 1 ]
alert=
for _ in $(seq 100); do
  prom /api/v1/alerts
  alert=$(json '(function() for _, a in ipairs(j.data.alerts) do if a.labels.alertname == "FuseCircuitOpen" and a.labels.name == "twostep" then return a.state end end end)()')
  [ "$alert" = pending ] && break
  sleep 0.2
done
check "FuseCircuitOpen is pending for twostep" [ "$alert" = pending ]
[ "$alert" = pending ] || diag "alerts: $BODY"
admin -d 'name=twostep&action=reset'

# ---------------------------------------------------------------- error log
log_clean "$P/logs/error.log" "no [error], [alert], [crit] or [emerg] in the nginx error log"

echo "1..$n"
[ "$failed" -eq 0 ]
