# shellcheck shell=bash
# test/lib/nginx.sh -- what the scripts that start nginx share; sourced, never run:
#     . "$ROOT/test/lib/nginx.sh"
# by test/*.t.sh, bench/nginx_*.sh and examples/nginx/*demo.sh. It defines functions and
# NGINX_MODULES only; nothing runs at source time. Safe under `set -eu`.
#
#   nginx_bin              the nginx binary: $NGINX as given, else nginx on PATH, else
#                          /usr/sbin/nginx (not on Debian's PATH for users other than
#                          root); prints nothing and fails when there is none
#   nginx_has_lua          the Lua module is installed (in NGINX_MODULES)
#   nginx_suite NAME [NEED...]
#                          the start of an nginx suite (test/*.t.sh), after tap.sh: the
#                          TAP header; NGINX, LUA_SRC (FUSE_LUA_DIR, else lua/), SO_SRC
#                          (FUSE_CORE_SO, else build/fuse/core.so); the suite skipped
#                          whole (skip_all) without nginx, its Lua module or a NEED:
#                          curl, wrk, iconv, prometheus ($PROMETHEUS), cjson (LUAJIT
#                          with lua-cjson), resty-core (ngx.balancer); a bail when SO_SRC
#                          or LUA_SRC/fuse.lua is missing; T, a new /tmp/fuse-NAME-test.*
#   nginx_load_modules     the two load_module lines a config starts with (absolute paths)
#   nginx_lua_paths DIR    lua_package_path/cpath lines for a copy_fuse DIR (end in ";;")
#   copy_fuse DIR [LUA SO] DIR/lua and DIR/build/fuse/core.so, readable by all (the
#                          workers run as nobody)
#   alive PID              a live process (a zombie waiting to be reaped is not)
#   stop_pid PID [SIGNAL]  SIGNAL (QUIT: nginx's graceful stop), up to 5 s, then KILL
#   stop_master PID        stop_pid PID QUIT
#   watchdog SECONDS       TERMs this script after SECONDS ("Bail out!" then exit 1)
#   cleanup_nginx PID...   for the EXIT trap: stops each master, the watchdog, and removes
#                          $T (KEEP=1 keeps it)
#   port_free PORT         nothing bound to PORT (any address, any state), nothing answers
#   pick_ports N           prints P with P .. P+N-1 free, from 10000-29999 (below the
#                          kernel's ephemeral range, 32768-60999)
#   nginx_start PREFIX CONF [GLOBALS]
#                          starts nginx; 0, or 1 with its output in NGINX_START_ERR
#   start_on_free_ports N FN [LOG...]
#                          PORT=$(pick_ports N) then FN, which writes the config(s) and
#                          starts nginx (nginx_start); up to 5 times while a start fails
#                          because a port was taken between the check and the bind
#   start_rendered N RENDER PREFIX
#                          start_on_free_ports N, where a try is: RENDER (writes
#                          PREFIX/nginx.conf for ports PORT .. PORT+N-1), PREFIX/logs/
#                          error.log emptied, nginx -p PREFIX -c nginx.conf; on failure
#                          NGINX_START_ERR ends with the error log's last lines
#   wait_for SECONDS CMD...  polls CMD every 0.1 s until it succeeds (0) or SECONDS pass (1)
#   workers [MASTER]       the master's children ($MASTER by default)
#   log_clean LOG DESC [PATTERN [EXCEPT]]
#                          the check DESC (tap.sh) that LOG has no line matching PATTERN
#                          (ERE; default nginx's [error] and worse) but those matching
#                          EXCEPT (ERE); the first 20 such lines as diag

NGINX_MODULES=/usr/lib/nginx/modules

nginx_bin() {
  if [ -n "${NGINX:-}" ]; then echo "$NGINX"
  elif command -v nginx; then :
  elif [ -x /usr/sbin/nginx ]; then echo /usr/sbin/nginx
  else return 1; fi
}

nginx_has_lua() { [ -r "$NGINX_MODULES/ngx_http_lua_module.so" ]; }

nginx_suite() {
  local name=$1 need root
  shift
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  echo "TAP version 13"
  PATH=$PATH:/usr/sbin:/sbin
  NGINX=$(nginx_bin)
  LUA_SRC=${FUSE_LUA_DIR:-$root/lua}
  SO_SRC=${FUSE_CORE_SO:-$root/build/fuse/core.so}
  if [ -z "$NGINX" ] || ! command -v "$NGINX" >/dev/null; then skip_all "nginx is not installed"; fi
  nginx_has_lua || skip_all "the nginx Lua module is not installed"
  for need in "$@"; do
    case $need in
      prometheus) command -v "${PROMETHEUS:-prometheus}" >/dev/null || skip_all "prometheus is not installed" ;;
      cjson) "${LUAJIT:-luajit}" -e 'require "cjson"' 2>/dev/null || skip_all "luajit with lua-cjson is not installed" ;;
      resty-core) [ -r /usr/share/lua/5.1/ngx/balancer.lua ] || skip_all "lua-resty-core (ngx.balancer) is not installed" ;;
      *) command -v "$need" >/dev/null || skip_all "$need is not installed" ;;
    esac
  done
  [ -r "$SO_SRC" ] || bail "$SO_SRC missing: run make first"
  [ -r "$LUA_SRC/fuse.lua" ] || bail "$LUA_SRC/fuse.lua missing"
  T=$(mktemp -d "/tmp/fuse-$name-test.XXXXXX") || bail "mktemp failed"
}

nginx_load_modules() {
  printf 'load_module %s/%s;\n' "$NGINX_MODULES" ndk_http_module.so \
    "$NGINX_MODULES" ngx_http_lua_module.so
}

# nginx_temp_paths: the http-level temp directories under the prefix's temp/ (lines of a
# generated config, so that nginx writes nothing outside its prefix)
nginx_temp_paths() {
  local d
  for d in client_body:body proxy fastcgi uwsgi scgi; do
    printf '    %s_temp_path temp/%s;\n' "${d%%:*}" "${d#*:}"
  done
}

nginx_lua_paths() {
  printf '    lua_package_path "%s/lua/?.lua;;";\n    lua_package_cpath "%s/build/?.so;;";\n' "$1" "$1"
}

# nginx_conf_head DIR WORKERS LOG_LEVEL CONNECTIONS: the head of a test's or a
# benchmark's nginx.conf, up to its http block's own directives: the modules, WORKERS
# workers, the error log at LOG_LEVEL, CONNECTIONS a worker, no access log, temp paths in
# the prefix, DIR's fuse (copy_fuse) on the Lua paths.
nginx_conf_head() {
  cat <<EOF
$(nginx_load_modules)
worker_processes $2;
pid logs/nginx.pid;
error_log logs/error.log $3;
events { worker_connections $4; }
http {
    access_log off;
$(nginx_temp_paths)
$(nginx_lua_paths "$1")
EOF
}

# bench_conf_head DIR: a benchmark's (2 workers, warn, 1024 connections).
bench_conf_head() { nginx_conf_head "$1" 2 warn 1024; }

copy_fuse() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  mkdir -p "$1/build/fuse" &&
    cp -R "${2:-$root/lua}" "$1/lua" &&
    cp "${3:-$root/build/fuse/core.so}" "$1/build/fuse/core.so" &&
    chmod -R a+rX "$1"
}

alive() {
  [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null &&
    [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]
}

stop_pid() {
  local pid=${1:-}
  alive "$pid" || return 0
  kill "-${2:-QUIT}" "$pid" 2>/dev/null
  for _ in $(seq 50); do alive "$pid" || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null
  return 0
}

stop_master() { stop_pid "${1:-}" QUIT; }

# The watchdog holds none of our output streams, so a caller reading them never waits on it.
watchdog() {
  # shellcheck disable=SC2064  # the seconds are expanded now, on purpose
  trap "echo 'Bail out! interrupted (a signal, or the $1 s watchdog)'; exit 1" INT TERM HUP
  ( trap 'kill "$sp" 2>/dev/null; exit 0' TERM
    sleep "$1" & sp=$!; wait "$sp" && kill -TERM $$
  ) </dev/null >/dev/null 2>&1 &
  WATCHDOG=$!
}

cleanup_nginx() {
  local pid
  for pid in "$@"; do stop_master "$pid"; done
  if [ -n "${WATCHDOG:-}" ]; then kill "$WATCHDOG" 2>/dev/null; WATCHDOG=; fi
  if [ -n "${T:-}" ]; then
    if [ "${KEEP:-0}" = 1 ]; then echo "# kept $T" >&2; else rm -rf "$T"; fi
  fi
  return 0
}

port_free() {
  ! cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '{ print $2 " " }' |
    grep -q "$(printf ':%04X ' "$1")" && ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# test_ports: the range the tests listen in, "LOW-HIGH" from FUSE_TEST_PORTS (default
# 10000-29999: below Linux's ephemeral range 32768-60999, where an outgoing connection of
# the test itself could take a port between the check and nginx's bind). Prints "LOW HIGH".
test_ports() {
  local r=${FUSE_TEST_PORTS:-10000-29999} lo hi
  lo=${r%%-*} hi=${r#*-}
  case $lo$hi in ''|*[!0-9]*) lo= ;; esac
  if [ -z "$lo" ] || [ "$r" = "$lo" ] || [ "$lo" -lt 1024 ] || [ "$hi" -gt 65535 ] || [ "$lo" -gt "$hi" ]; then
    echo "FUSE_TEST_PORTS must be LOW-HIGH with 1024 <= LOW <= HIGH <= 65535, got '$r'" >&2
    return 1
  fi
  echo "$lo $hi"
}

# pick_ports N: N free consecutive loopback ports in the test range (test_ports).
pick_ports() {
  local p i lo hi
  read -r lo hi < <(test_ports) || return 1
  [ -n "$lo" ] || return 1
  [ $((hi - lo + 1)) -ge "$1" ] || { echo "FUSE_TEST_PORTS $lo-$hi holds fewer than $1 ports" >&2; return 1; }
  for _ in $(seq 100); do
    p=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo + 2 - $1)))
    for ((i = 0; i < $1; i++)); do port_free $((p + i)) || continue 2; done
    echo "$p"
    return 0
  done
  return 1
}

nginx_start() {
  NGINX_START_ERR=$("$NGINX" -p "$1/" -c "$2" ${3:+-g "$3"} 2>&1)
}

start_on_free_ports() {
  local n=$1 fn=$2
  shift 2
  NGINX_START_ERR=
  for _ in 1 2 3 4 5; do
    PORT=$(pick_ports "$n") || { NGINX_START_ERR="no $n free ports in a row"; return 1; }
    "$fn" && return 0
    case $NGINX_START_ERR in
      *"Address already in use"*|*"bind()"*) ;;
      *) [ $# -gt 0 ] && grep -qsE "Address already in use|bind\(\)" "$@" || return 1 ;;
    esac
    echo "# ports $PORT-$((PORT + n - 1)) were taken meanwhile: trying others"
  done
  return 1
}

start_rendered() {
  START_RENDER=$2 START_PREFIX=$3
  start_on_free_ports "$1" start_rendered_once "$3/logs/error.log" && return 0
  NGINX_START_ERR="$NGINX_START_ERR
$(tail -n 20 "$3/logs/error.log" 2>/dev/null)"
  return 1
}
start_rendered_once() {
  "$START_RENDER" && : > "$START_PREFIX/logs/error.log" && nginx_start "$START_PREFIX" nginx.conf
}

wait_for() {
  local limit=$(($1 * 10)) i=0
  shift
  until "$@"; do
    i=$((i + 1))
    [ "$i" -ge "$limit" ] && return 1
    sleep 0.1
  done
}

log_clean() {
  local errs
  [ -r "$1" ] || { nok "$2 (cannot read $1)"; return; }
  errs=$(grep -E "${3:-\[(error|alert|crit|emerg)\]}" "$1" | grep -vE "${4:-^\$}")
  check "$2" [ -z "$errs" ]
  [ -z "$errs" ] || diag "$(head -n 20 <<< "$errs")"
}

# shellcheck disable=SC2120  # MASTER is optional
workers() {
  local m=${1:-${MASTER:-}}
  [ -n "$m" ] || return 0
  if command -v ps >/dev/null; then ps -o pid= --ppid "$m" | tr -d ' '
  else grep -l "^PPid:[[:space:]]*$m\$" /proc/[0-9]*/status 2>/dev/null | cut -d/ -f3; fi
}

# reloaded SECS OLD...: after a HUP, waits (up to SECS) until no worker of OLD is alive
# and the master has workers again, so that every later request reaches a new worker.
# An old worker answers requests until it exits: the first new answer proves nothing.
reloaded() {
  local secs=$1
  shift
  wait_for "$secs" _reloaded_now "$@"
}
_reloaded_now() {
  local p
  for p in "$@"; do alive "$p" && return 1; done
  [ -n "$(workers)" ]
}

# start_isolation_example P: examples/nginx/isolation.conf (the front, on PORT) and
# slow-upstream.conf (on PORT + 1, as UP) rendered into prefix P on free ports and
# started; their masters' pids in PIDS. make demo-nginx and make bench-nginx use it.
# ISOLATION_LIMIT in the environment reaches the front (its max_concurrent).
start_isolation_example() {
  ISOLATION_PREFIX=$1
  start_on_free_ports 2 _isolation_render || return 1
  PIDS=("$(cat "$1/logs/nginx.pid")" "$(cat "$1/logs-up/nginx.pid")")
}
_isolation_render() {
  local root f P=$ISOLATION_PREFIX
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  UP=$((PORT + 1))
  for f in isolation slow-upstream; do
    sed -e "s/127\.0\.0\.1:18180/127.0.0.1:$PORT/g" -e "s/127\.0\.0\.1:18181/127.0.0.1:$UP/g" \
      "$root/examples/nginx/$f.conf" > "$P/$f.conf"
  done
  chmod a+r "$P"/*.conf
  nginx_start "$P" slow-upstream.conf || return 1
  nginx_start "$P" isolation.conf || { stop_master "$(cat "$P/logs-up/nginx.pid" 2>/dev/null)"; return 1; }
}

# ---- side by side: this tree and BASE, each in an nginx of its own, measured in the same
# rounds (bench/nginx_registry.sh, bench/nginx_scrape.sh). The script sets ROOT, NGINX and
# BASE (a tree with lua/ and a built build/fuse/core.so, or empty) and defines
# start_tree INDEX NAME: it writes "$T/NAME/p/nginx.conf" (side_tree_head gives its head)
# and calls side_tree_run.

# side_trees WHAT: the builds checked; T (a temp dir), TREES ("this", or "base" and
# "this"), PORTS (one per tree), MASTER_OF and MASTERS set; an EXIT trap stops the masters.
# shellcheck disable=SC2153  # ROOT and BASE: the calling script's
side_trees() {
  [ -r "$ROOT/build/fuse/core.so" ] || { echo "run make first" >&2; exit 1; }
  if [ -n "$BASE" ]; then
    BASE=$(cd "$BASE" && pwd)
    [ -r "$BASE/build/fuse/core.so" ] || { echo "$1: no $BASE/build/fuse/core.so" >&2; exit 1; }
  fi
  T=$(mktemp -d "/tmp/fuse-$1.XXXXXX")
  MASTERS=()
  trap 'cleanup_nginx "${MASTERS[@]}"' EXIT
  TREES=(this) PORTS=() MASTER_OF=()
  [ -n "$BASE" ] && TREES=(base this)
  read -r -a PORTS <<<"$(p=$(pick_ports ${#TREES[@]}); seq "$p" $((p + ${#TREES[@]} - 1)) | tr '\n' ' ')"
}

# side_tree_head NAME: the head of "$T/NAME"'s nginx.conf (bench_conf_head).
side_tree_head() { bench_conf_head "$T/$1"; }

# side_tree_run INDEX NAME PATH: starts "$T/NAME/p"'s nginx (its master in MASTER_OF and
# MASTERS) and waits until PATH on the tree's port answers.
side_tree_run() {
  local d="$T/$2"
  "$NGINX" -p "$d/p/" -c nginx.conf
  wait_for 60 test -s "$d/p/logs/nginx.pid" || { echo "nginx ($2) did not start" >&2; exit 1; }
  MASTER_OF[$1]=$(cat "$d/p/logs/nginx.pid")
  MASTERS+=("${MASTER_OF[$1]}")
  wait_for 60 curl -sf -o /dev/null "http://127.0.0.1:${PORTS[$1]}$3" || { echo "nginx ($2) does not answer" >&2; exit 1; }
}

# side_trees_start: for each tree, "$T/NAME" made with its fuse (BASE's for "base"), then
# start_tree INDEX NAME.
side_trees_start() {
  local i d
  for i in "${!TREES[@]}"; do
    d="$T/${TREES[$i]}"
    mkdir -p "$d/p/logs" "$d/p/temp"
    if [ "${TREES[$i]}" = base ]; then copy_fuse "$d" "$BASE/lua" "$BASE/build/fuse/core.so"
    else copy_fuse "$d" "$ROOT/lua" "$ROOT/build/fuse/core.so"; fi
    start_tree "$i" "${TREES[$i]}"
  done
}
