#!/usr/bin/env bash
# test/readme.t.sh -- README.md's code blocks, and those of docs/openresty.md and
# docs/testing.md that go with them, run as printed (prints TAP).
#
# Each block is taken from its file with tools/readme-block NAME FILE (the marker
# `<!-- test: NAME -->` stands before it), so the text cannot drift from what runs.
# README.md holds synopsis, synopsis-rejection, synopsis-output and openresty-conf;
# docs/openresty.md synopsis-openresty and openresty-start/-try/-try-output/-stop;
# docs/testing.md testing-spec and testing-run:
#   synopsis + synopsis-rejection   run under LuaJIT (FFI) and Lua 5.4 (C module); their
#                                   output must be synopsis-output
#   synopsis-openresty              every line of the excerpt is in openresty-conf, in order
#   openresty-conf                  run in a real nginx with 4 workers: openresty-start starts
#   openresty-start/-try/-stop      it, 20 bad inputs must leave the breaker closed,
#                                   openresty-try must print openresty-try-output, every
#                                   worker must see the open circuit, the two-step form must
#                                   open after 5 failures, openresty-stop stops it by its pid
#   testing-spec + testing-run      the spec of "Testing code that uses fuse", run with busted
#                                   as printed, under LuaJIT and Lua 5.1
# The only changes made to a block are the ones README tells its reader to make: the
# ports 8080-8082 (free ones instead), /path/to/fuse (a copy of lua/ and build/fuse/core.so
# that nginx's workers, running as nobody, can read) and the nginx prefix /tmp/fuse-nginx.
# A part whose tool is missing is skipped ("ok # SKIP"); under CI (CI=true) it fails.
# README_FILE=other.md runs the blocks of another file (to show that a broken README fails);
# OPENRESTY_DOC and TESTING_DOC do the same for the two pages.
# KEEP=1 keeps the temp directory. A watchdog stops the test after 120 s.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
README=${README_FILE:-$ROOT/README.md}
OPENRESTY_DOC=${OPENRESTY_DOC:-$ROOT/docs/openresty.md}
TESTING_DOC=${TESTING_DOC:-$ROOT/docs/testing.md}
LUAJIT=${LUAJIT:-luajit}
LUA54=${LUA54:-lua5.4}
BUSTED=${BUSTED:-busted}
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
NGINX=$(nginx_bin)

# shellcheck source=test/lib/tap.sh
. "$ROOT/test/lib/tap.sh"   # ok, nok, diag, check, bail, skip, skip_all
block() { "$ROOT/tools/readme-block" "$1" "${2:-$README}"; }   # block NAME [FILE]

echo "TAP version 13"
T=$(mktemp -d /tmp/fuse-readme-test.XXXXXX) || { echo "Bail out! mktemp failed"; exit 1; }
MASTER=
trap 'cleanup_nginx "$MASTER"' EXIT
watchdog 120

[ -r "$ROOT/build/fuse/core.so" ] || { echo "Bail out! build/fuse/core.so missing: run make"; exit 1; }

# The fuse a reader points /path/to/fuse at: lua/ and build/fuse/core.so, readable by all.
F=$T/fuse
copy_fuse "$F"
mkdir -p "$F/build/5.4/fuse"
[ -r "$ROOT/build/5.4/fuse/core.so" ] && cp "$ROOT/build/5.4/fuse/core.so" "$F/build/5.4/fuse/"
chmod -R a+rX "$T"

# ---------------------------------------------------------------- the plain Lua synopsis
{ block synopsis && block synopsis-rejection; } > "$T/synopsis.lua" 2> "$T/block.err"
check "synopsis: README has the blocks synopsis and synopsis-rejection" [ -s "$T/synopsis.lua" ]
block synopsis-output > "$T/synopsis.expected" 2>> "$T/block.err"
[ -s "$T/block.err" ] && diag "$(cat "$T/block.err")"

# run_synopsis NAME LUA CPATH: the synopsis under LUA, its output against synopsis-output
run_synopsis() {
  local name=$1 lua=$2 cpath=$3
  if ! command -v "$lua" >/dev/null; then skip "synopsis runs as printed under $name" "$lua not installed"; return; fi
  if [ ! -r "$F/$cpath" ]; then skip "synopsis runs as printed under $name" "$cpath not built"; return; fi
  if LUA_PATH="$F/lua/?.lua;;" LUA_CPATH="$F/${cpath%fuse/core.so}?.so;;" \
      "$lua" "$T/synopsis.lua" > "$T/synopsis.out" 2>&1 &&
     diff "$T/synopsis.expected" "$T/synopsis.out" > "$T/synopsis.diff"; then
    ok "synopsis runs as printed under $name and prints synopsis-output"
  else
    nok "synopsis runs as printed under $name and prints synopsis-output"
    diag "output (diff against synopsis-output):" "$(cat "$T/synopsis.out")" "$(cat "$T/synopsis.diff" 2>/dev/null)"
  fi
}
run_synopsis "LuaJIT (ffi)" "$LUAJIT" build/fuse/core.so
run_synopsis "Lua 5.4 (capi)" "$LUA54" build/5.4/fuse/core.so

# ---------------------------------------------------------------- the OpenResty excerpt
block openresty-conf > "$T/readme.conf" 2> "$T/block.err"
check "openresty-conf: README has the block" [ -s "$T/readme.conf" ]
[ -s "$T/block.err" ] && diag "$(cat "$T/block.err")"
# every line of the excerpt but "...", trimmed, in the config, in the same order
if block synopsis-openresty "$OPENRESTY_DOC" > "$T/excerpt" && awk '
    function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
    NR == FNR { c = trim($0); if (c != "") conf[++nc] = c; next }
    { e = trim($0); if (e == "" || e == "...") next
      while (i < nc && conf[++i] != e) {}
      if (conf[i] != e) { print "not in the config (in this order): " e; bad = 1; exit } }
    END { exit bad }' "$T/readme.conf" "$T/excerpt" > "$T/excerpt.out"; then
  ok "synopsis-openresty: every line is in openresty-conf, in order"
else
  nok "synopsis-openresty: every line is in openresty-conf, in order"
  diag "$(cat "$T/excerpt.out" 2>/dev/null)"
fi

# ---------------------------------------------------------------- the OpenResty config, in nginx
# localize: the changes README tells its reader to make, and nothing else
localize() {
  sed -e "s|/path/to/fuse|$F|g" -e "s|/tmp/fuse-nginx|$T/prefix|g" \
      -e "s/127\.0\.0\.1:8080/127.0.0.1:$PORT/g" -e "s/127\.0\.0\.1:8081/127.0.0.1:$((PORT + 1))/g" \
      -e "s/127\.0\.0\.1:8082/127.0.0.1:$((PORT + 2))/g"
}
# runblock NAME: a shell block of docs/openresty.md, localized, run by bash in $T (nginx found in /usr/sbin too)
runblock() {
  block "$1" "$OPENRESTY_DOC" > "$T/$1.raw" || return 1
  localize < "$T/$1.raw" > "$T/$1.sh"
  (cd "$T" && PATH="$PATH:/usr/sbin" bash -e "$T/$1.sh")
}
get() { # get PATH: one request on a fresh connection; sets CODE, WORKER, BODY
  local out
  out=$(curl -s -m 5 -H 'Connection: close' -o "$T/body" -w '%{http_code} %header{x-worker}' \
    "http://127.0.0.1:$PORT$1")
  CODE=${out%% *} WORKER=${out#* } BODY=$(cat "$T/body" 2>/dev/null)
}
metric() { # metric NAME BREAKER: its value in BODY (a /metrics answer)
  printf '%s\n' "$BODY" | sed -n "s/^$1{name=\"$2\"} //p"
}

NGINX_TESTS=(
  "openresty-start: nginx starts with 4 workers"
  "20 bad inputs: each answered 400, no Lua error shown to the client"
  "20 bad inputs: the users breaker is still closed and counted nothing"
  "openresty-try prints openresty-try-output"
  "every one of the 4 workers sees users tripped (/metrics)"
  "billing, two steps: 5 x 502 then 503 from the access phase"
  "openresty-stop stops nginx (by the pid in its pid file)"
  "no [alert], [crit] or [emerg], and no Lua error, in the error log"
)
v=$(curl --version 2>/dev/null | head -n 1 | cut -d' ' -f2)
why=
if [ -z "$NGINX" ]; then why="nginx not installed"
elif ! nginx_has_lua; then why="the nginx Lua module is not installed"
elif [ -z "$v" ] || [ "$(printf '%s\n' 7.84.0 "$v" | sort -V | head -n 1)" != 7.84.0 ]; then
  why="curl >= 7.84 not installed"
elif ! PORT=$(pick_ports 3); then why="no free ports"   # front, users stand-in, billing (nothing listens)
fi
if [ -n "$why" ]; then
  for t in "${NGINX_TESTS[@]}"; do skip "$t" "$why"; done
else
  mkdir -p "$T/prefix"
  localize < "$T/readme.conf" > "$T/nginx.conf"
  chmod -R a+rX "$T"
  if runblock openresty-start > "$T/start.out" 2>&1; then
    MASTER=$(cat "$T/prefix/logs/nginx.pid" 2>/dev/null)
  fi
  for _ in $(seq 50); do
    [ -n "$MASTER" ] || break
    get /metrics; [ "$CODE" = 200 ] && break; sleep 0.1
  done
  nw=0; [ -n "$MASTER" ] && nw=$(workers | grep -c .)
  check "${NGINX_TESTS[0]}" [ "$nw" -eq 4 ]
  [ "$nw" -eq 4 ] || diag "master '$MASTER', $nw workers" "$(cat "$T/start.out")" \
    "$(tail -n 20 "$T/prefix/logs/error.log" 2>/dev/null)"

  # Bad input first: had it counted, 20 of them would have opened the breaker (fails = 5).
  codes="" leak=""
  for i in $(seq 20); do
    case $((i % 5)) in
      0) u=/users/abc ;; 1) u=/users/ ;; 2) u=/users/12x ;; 3) u=/users/-1 ;; 4) u=/users/1/2 ;;
    esac
    get "$u"
    codes="$codes$CODE "
    case $BODY in *init_by_lua*|*attempt\ to*|*nil\ value*) leak="$leak $u: $BODY" ;; esac
  done
  check "${NGINX_TESTS[1]}" [ "$codes/$leak" = "$(printf '400 %.0s' $(seq 20))/" ]
  [ -z "$leak" ] || diag "leaked: $leak"
  [ "$codes" = "$(printf '400 %.0s' $(seq 20))" ] || diag "codes: $codes"
  get /metrics
  got="$(metric fuse_state users)/$(metric fuse_calls_total users)/$(metric fuse_failures_total users)"
  check "${NGINX_TESTS[2]}" [ "$got" = 0/0/0 ]
  [ "$got" = 0/0/0 ] || diag "users state/calls_total/failures_total: $got"

  # README's session, as printed
  runblock openresty-try > "$T/try.out" 2> "$T/try.err"
  block openresty-try-output "$OPENRESTY_DOC" > "$T/try.expected"
  if diff "$T/try.expected" "$T/try.out" > "$T/try.diff"; then ok "${NGINX_TESTS[3]}"
  else nok "${NGINX_TESTS[3]}"; diag "diff expected got:" "$(cat "$T/try.diff" "$T/try.err")"; fi

  # Every worker sees the one shared state: open (1), or half_open (2) once open_for's
  # 5 s have passed, which a loaded machine can reach before all 4 workers answered.
  # A worker with a state of its own would show closed (0).
  seen="" bad=""
  for _ in $(seq 200); do
    get /metrics
    case $(metric fuse_state users) in 1|2) ;; *) bad="$bad $WORKER:$(metric fuse_state users)" ;; esac
    case " $seen " in *" $WORKER "*) ;; *) seen="$seen $WORKER" ;; esac
    [ "$(echo "$seen" | wc -w)" -ge 4 ] && break
  done
  check "${NGINX_TESTS[4]}" [ "$(echo "$seen" | wc -w)/$bad" = 4/ ]
  diag "workers seen: $seen${bad:+; not open:$bad}"

  # README: six requests give five 502s, then the rejection. The report is made in the
  # log phase, just after the response: before the next request, wait (up to 5 s) until
  # /metrics shows it, as a person typing the requests would.
  codes="" last=""
  for i in $(seq 6); do
    get /billing/; codes="$codes$CODE " last=$BODY
    [ "$i" -lt 6 ] || break
    for _ in $(seq 50); do
      get /metrics
      [ "$(metric fuse_failures_total billing)" = "$i" ] && break
      sleep 0.1
    done
  done
  BODY=$last
  case $codes/$BODY in
    "502 502 502 502 502 503 /fuse: circuit 'billing' is open, retry in "[1-5]" s") ok "${NGINX_TESTS[5]}" ;;
    *) nok "${NGINX_TESTS[5]}"; diag "codes: $codes" "last body: $BODY" ;;
  esac

  runblock openresty-stop > "$T/stop.out" 2>&1
  for _ in $(seq 50); do alive "$MASTER" || break; sleep 0.1; done
  if alive "$MASTER"; then nok "${NGINX_TESTS[6]}"; diag "$(cat "$T/stop.out")"
  else ok "${NGINX_TESTS[6]}"; fi

  # [error] lines are expected: the fallback logs each users failure, nginx each refused
  # billing connection. Anything worse, or a Lua error, is not.
  log_clean "$T/prefix/logs/error.log" "${NGINX_TESTS[7]}" \
    '\[(alert|crit|emerg)\]|runtime error|attempt to|stack traceback'
fi

# ---------------------------------------------------------------- testing with busted
block testing-spec "$TESTING_DOC" > "$T/users_spec.lua" 2> "$T/block.err"
block testing-run "$TESTING_DOC" > "$T/testing-run.raw" 2>> "$T/block.err"
have=0; [ -s "$T/users_spec.lua" ] && [ -s "$T/testing-run.raw" ] && have=1
check "testing: README has the blocks testing-spec and testing-run" [ "$have" = 1 ]
[ -s "$T/block.err" ] && diag "$(cat "$T/block.err")"
BUSTED_TESTS=(
  "testing-run: both busted commands pass, as printed"
  "testing-run: the first ran on the ffi backend (LuaJIT), the second on capi (Lua 5.1)"
  "testing-run: each run passed README's 2 tests (+ the backend one)"
)
if ! command -v "$BUSTED" >/dev/null; then
  for t in "${BUSTED_TESTS[@]}"; do skip "$t" "busted not installed"; done
elif ! command -v "$LUAJIT" >/dev/null; then
  for t in "${BUSTED_TESTS[@]}"; do skip "$t" "luajit not installed"; done
else
  # a project of the reader's: spec/users_spec.lua, and a spec that says which backend ran
  P=$T/project
  mkdir -p "$P/spec"
  cp "$T/users_spec.lua" "$P/spec/users_spec.lua"
  cat > "$P/spec/backend_spec.lua" <<'EOF'
describe("backend", function()
  it("is known", function() io.stdout:write("BACKEND=", require("fuse")._backend, "\n") end)
end)
EOF
  sed "s|/path/to/fuse|$F|g" "$T/testing-run.raw" > "$T/testing-run.sh"
  if (cd "$P" && bash -e "$T/testing-run.sh") > "$T/busted.out" 2>&1; then
    ok "${BUSTED_TESTS[0]}"
  else
    nok "${BUSTED_TESTS[0]}"; diag "$(tail -n 30 "$T/busted.out")"
  fi
  backends=$(sed -n 's/.*BACKEND=\([a-z]*\).*/\1/p' "$T/busted.out" | tr '\n' ' ')
  check "${BUSTED_TESTS[1]}" [ "$backends" = "ffi capi " ]
  [ "$backends" = "ffi capi " ] || diag "backends: $backends"
  # 3 specs per run (2 of README's + the backend one), 2 runs: 6 successes
  succ=$(grep -c '^3 successes / 0 failures / 0 errors' "$T/busted.out")
  check "${BUSTED_TESTS[2]}" [ "$succ" = 2 ]
  [ "$succ" = 2 ] || diag "$(grep -E 'success' "$T/busted.out")"
fi

echo "1..$n"
[ "$failed" -eq 0 ]
