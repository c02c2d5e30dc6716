#!/usr/bin/env bash
# examples/nginx/demo.sh -- one circuit breaker shared by 4 nginx workers, narrated.
# Run by `make demo-nginx`. Starts examples/nginx/nginx.conf in a temp prefix on free
# loopback ports, walks through a failure and a recovery, stops nginx by its pid.
set -u

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# alive, stop_master, pick_ports...: shared with the tests that start nginx
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
# nginx: on PATH, or in /usr/sbin (not on Debian's PATH for users other than root)
NGINX=$(nginx_bin)
SO=$ROOT/build/fuse/core.so

die() { echo "demo-nginx: $*" >&2; exit 1; }
command -v "$NGINX" >/dev/null || die "nginx is not installed (Debian: nginx libnginx-mod-http-lua)"
command -v curl >/dev/null || die "curl is not installed"
[ -r "$SO" ] || die "$SO is missing: run make first"

T=$(mktemp -d /tmp/fuse-nginx-demo.XXXXXX) || die "mktemp failed"
P=$T/examples/nginx
MASTER=
trap 'cleanup_nginx "$MASTER"' EXIT   # stops nginx by its pid, removes the temp prefix
trap 'exit 1' INT TERM HUP

# The same layout as the repository (lua/, build/, examples/nginx/), readable by the
# workers, which run as nobody.
mkdir -p "$P/logs" "$P/temp"
copy_fuse "$T" "$ROOT/lua" "$SO"
cp "$ROOT/examples/nginx/app.lua" "$P/"
chmod -R a+rX "$T"

# Free ports (nothing bound, nothing answering) PORT, UP and PORT + 2 (admin); nginx is
# started again on other ports when a bind fails anyway.
render_conf() {
  UP=$((PORT + 1))
  sed -e "s/127\.0\.0\.1:18080/127.0.0.1:$PORT/g" -e "s/127\.0\.0\.1:18081/127.0.0.1:$UP/g" \
    -e "s/127\.0\.0\.1:18082/127.0.0.1:$((PORT + 2))/g" "$ROOT/examples/nginx/nginx.conf" > "$P/nginx.conf"
  chmod a+r "$P/nginx.conf"
}
start_rendered 3 render_conf "$P" || die "nginx did not start: $NGINX_START_ERR"
MASTER=$(cat "$P/logs/nginx.pid")
for _ in $(seq 300); do   # up to 30 s on a busy machine
  curl -s -m 1 -o /dev/null "http://127.0.0.1:$PORT/state" && break
  sleep 0.1
done

# get PATH: one request on a fresh connection; sets CODE, WPID, BODY
get() {
  local out
  out=$(curl -s -m 5 -H 'Connection: close' -o "$T/body" \
    -w '%{http_code} %header{x-worker-pid}' "http://127.0.0.1:$PORT$1")
  CODE=${out%% *} WPID=${out#* } BODY=$(cat "$T/body")
}
fake() { curl -s -m 5 "http://127.0.0.1:$UP$1" > /dev/null; }
hits() { curl -s -m 5 "http://127.0.0.1:$UP/__hits" | sed -n "s/.* $1=\([0-9]*\).*/\1/p"; }
state_of() { printf '%s' "$1" | grep -o '"upstream":{"state":"[a-z_]*"' | cut -d'"' -f6; }
say() { printf '\n== %s\n' "$*"; }

# Every worker's view: /state until each of the 4 workers answered (at most 200 tries).
all_workers() {
  local seen="" line=""
  for _ in $(seq 200); do
    get /state
    case " $seen " in *" $WPID "*) continue ;; esac
    seen="$seen $WPID"
    line="$line  worker $WPID: $(state_of "$BODY")"
    [ "$(echo "$seen" | wc -w)" -ge 4 ] && break
  done
  echo "  $line"
}

WORKERS=$(workers | sort -n | tr '\n' ' ')
say "nginx master $MASTER, workers: $WORKERS"
echo "   front http://127.0.0.1:$PORT   fake upstream http://127.0.0.1:$UP"
echo "   breaker 'upstream': fails=3 window=10 open_for=1 probes=1, created in init_by_lua"
echo "   after fuse.init{shared=true}: its state lives in memory every worker maps"

say "the upstream is healthy: 8 requests at once, spread over the workers"
curl -s -m 10 --no-progress-meter --parallel --parallel-immediate -H 'Connection: close' \
  -o "$T/par#1" -w '   %{http_code} from worker %header{x-worker-pid}\n' \
  "http://127.0.0.1:$PORT/api?i=[1-8]" 2>/dev/null | sort | uniq -c

say "the upstream starts failing (HTTP 500); requests one after another:"
fake '/__control?mode=fail&reset=hits'
for i in $(seq 8); do
  get /api
  printf '   #%d  worker %-7s %s  %s\n' "$i" "$WPID" "$CODE" "$(head -n 1 "$T/body")"
done
echo "   -> the upstream saw $(hits fail) requests: fails=3 in total, counted across workers,"
echo "      not 3 per worker; every later call got the fallback's 503 without touching it"

say "every worker sees the same open circuit:"
all_workers

say "the upstream recovers; after open_for (1 s) one probe is let through:"
fake '/__control?mode=ok&reset=hits'
sleep 1.1
get /api
printf '   probe  worker %-7s %s  %s\n' "$WPID" "$CODE" "$(head -n 1 "$T/body")"
echo "   -> the upstream saw $(hits ok) request (the probe); it succeeded and closed the circuit"
all_workers

ADMIN=$((PORT + 2))
say "an operator forces 'twostep' open for 3 s, through the admin endpoint"
# the token of nginx.conf's admin listener: a POST without it is refused
TOKEN=$(sed -n 's/.*admin{ token = "\([^"]*\)" }.*/\1/p' "$P/nginx.conf")
echo "   (its own listener, 127.0.0.1:$ADMIN, allow 127.0.0.1; deny all; a POST needs its token):"
echo "   curl -H 'Authorization: Bearer $TOKEN' -d 'name=twostep&action=force_open&seconds=3' http://127.0.0.1:$ADMIN/fuse"
t0=$(date +%s.%N)
curl -s -m 5 -H "Authorization: Bearer $TOKEN" -d 'name=twostep&action=force_open&seconds=3' "http://127.0.0.1:$ADMIN/fuse" |
  grep -o '"\(name\|state\|retry_after\)":[^,}]*' | tr '\n' ' ' | sed 's/^/   -> /'
echo
for _ in $(seq 12); do
  out=$(curl -s -m 5 -H 'Connection: close' -o "$T/body" \
    -w '%{http_code} %header{x-worker-pid} %header{retry-after}' "http://127.0.0.1:$PORT/twostep")
  read -r code wpid ra <<< "$out"
  printf '   t=%4.1fs  worker %-7s %s  Retry-After: %-2s %s\n' \
    "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" "$wpid" "$code" "${ra:--}" \
    "$(head -n 1 "$T/body")"
  [ "$code" = 200 ] && break
  sleep 0.4
done
echo "   -> every worker answered 503 with Retry-After (fuse.reject) until the 3 s were over;"
echo "      the first call after them was the probe (forced_open -> open -> half_open):"
echo "      it went through and closed the circuit"
sleep 0.6
echo "   what each worker's fuse.watch logged (error.log, [warn]):"
grep -F "fuse: breaker twostep" "$P/logs/error.log" | tail -n 16 |
  sed 's/.*\[warn\] \([0-9]*\)#.*fuse: breaker \(.*\), context.*/     worker \1: \2/'

say "/metrics (excerpt, breaker 'upstream'):"
get /metrics
printf '%s\n' "$BODY" | grep 'name="upstream"' | head -n 12 | sed 's/^/   /'

say "stopping nginx (pid $MASTER)"

# ---- fuse.upstream: a breaker per upstream peer (README "Upstream peers"), then
# max_concurrent: a bulkhead across the workers (README "Isolation")
cleanup_nginx "$MASTER"
bash "$ROOT/examples/nginx/upstream-demo.sh"
bash "$ROOT/examples/nginx/isolation-demo.sh"
