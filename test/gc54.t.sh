#!/usr/bin/env bash
# test/gc54.t.sh -- Lua 5.4 finalizers and fuse's breaker handles, under ASan (TAP).
#
# Builds the Lua 5.4 C module with AddressSanitizer into a temp dir and runs
# test/lua/gc54.lua with it: objects whose __gc calls through a breaker, wrappers that
# a finalizer resurrects, and breakers alive at lua_close. No use after free, no leak
# (each breaker is freed by its handle's second __gc, or by the reaper at lua_close).
# Skips without gcc, lua5.4 or its headers (fails under CI=true).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
echo "TAP version 13"
skip() {
  if [ "${CI:-}" = true ]; then echo "Bail out! $* (CI=true: cannot skip)"; exit 1; fi
  echo "1..0 # SKIP $*"; exit 0
}
command -v lua5.4 >/dev/null || skip "lua5.4 not installed"
command -v gcc >/dev/null || skip "gcc not installed"
LUA54_CFLAGS=$(pkg-config --cflags lua5.4 2>/dev/null) || skip "no pkg-config for lua5.4"
ASAN_LIB=$(gcc -print-file-name=libasan.so)
[ -e "$ASAN_LIB" ] || skip "libasan not installed"

T=$(mktemp -d /tmp/fuse-gc54.XXXXXX) || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/fuse"
n=0 failed=0
ok()  { n=$((n + 1)); echo "ok $n - $1"; }
nok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; }

# shellcheck disable=SC2086  # LUA54_CFLAGS is a list of flags
if gcc $LUA54_CFLAGS -I"$ROOT/csrc" -std=c11 -O1 -g -fPIC -fsanitize=address,undefined \
    -fno-omit-frame-pointer -D_GNU_SOURCE -shared -o "$T/fuse/core.so" \
    $(ls "$ROOT"/csrc/*.c) -pthread -lm 2> "$T/cc.err"; then
  ok "the Lua 5.4 module builds with ASan"
else
  nok "the Lua 5.4 module builds with ASan"; sed 's/^/# /' "$T/cc.err"; echo "1..$n"; exit 1
fi

ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 LD_PRELOAD="$ASAN_LIB" \
  LUA_PATH="$ROOT/lua/?.lua;;" LUA_CPATH="$T/?.so" \
  lua5.4 "$ROOT/test/lua/gc54.lua" > "$T/out" 2> "$T/err"
rc=$?
grep '^#' "$T/out"
if grep -q '^done$' "$T/out"; then ok "finalizers call through breakers, resurrected wrappers work"
else nok "finalizers call through breakers, resurrected wrappers work"; fi
if [ "$rc" = 0 ] && ! grep -qE 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$T/err"; then
  ok "no use after free and no leak, lua_close included"
else
  nok "no use after free and no leak, lua_close included (exit $rc)"
  head -n 30 "$T/err" | sed 's/^/# /'
fi
echo "1..$n"
[ "$failed" -eq 0 ]
