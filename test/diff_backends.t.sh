#!/usr/bin/env bash
# test/diff_backends.t.sh -- the two backends agree (TAP).
#
# Runs test/lua/diff_backends.lua (the same API calls on a fake clock, every result,
# message and state printed one per line) under LuaJIT with the FFI backend, under
# LuaJIT with the C module, and under Lua 5.1 and 5.4 with the C module, and diffs each
# output against the FFI run's: the same program must print the same thing under every
# Lua (numbers too: "10", never 5.4's "10.0"). Skips a Lua that is not installed (fails
# under CI=true).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/test/lib/tap.sh"
echo "TAP version 13"

T=$(mktemp -d /tmp/fuse-diff.XXXXXX) || bail "mktemp failed"
trap 'rm -rf "$T"' EXIT
SCRIPT=$ROOT/test/lua/diff_backends.lua
export LUA_PATH="$ROOT/lua/?.lua;$ROOT/lua/?/init.lua;;"

# run NAME CPATH LUA [ARG]: the script's output in $T/NAME.out, its status checked
run() {
  local name=$1 cpath=$2 lua=$3
  shift 3
  if ! command -v "$lua" >/dev/null; then skip "$name runs the script" "$lua not installed"; return 1; fi
  if LUA_CPATH="$cpath;;" "$lua" "$SCRIPT" "$@" >"$T/$name.out" 2>"$T/$name.err" \
      && [ "$(tail -n 1 "$T/$name.out")" = "# end" ]; then
    ok "$name runs the script to its end ($(wc -l <"$T/$name.out") lines)"
  else
    nok "$name runs the script to its end"
    diag "stderr:" "$(tail -n 5 "$T/$name.err")"
    return 1
  fi
}

run luajit-ffi "$ROOT/build/?.so" luajit || bail "the reference run (LuaJIT, ffi) failed"
grep -q "^# tickets" "$T/luajit-ffi.out" || bail "the reference run printed no tickets section"
for spec in "luajit-capi|$ROOT/build/?.so|luajit|capi" "lua5.1|$ROOT/build/?.so|lua5.1" \
            "lua5.4|$ROOT/build/5.4/?.so|lua5.4"; do
  IFS='|' read -r name cpath lua extra <<<"$spec"
  # shellcheck disable=SC2086  # extra: no argument, or one word
  run "$name" "$cpath" "$lua" $extra || continue
  if diff -u "$T/luajit-ffi.out" "$T/$name.out" >"$T/$name.diff"; then
    ok "$name prints what LuaJIT with the ffi backend prints"
  else
    nok "$name prints what LuaJIT with the ffi backend prints"
    diag "$(head -n 40 "$T/$name.diff")"
  fi
done
echo "1..$n"
[ "$failed" -eq 0 ]
