#!/usr/bin/env bash
# test/dist.t.sh -- `make dist` gives a source rock that luarocks installs offline into a
# fresh tree, for LuaJIT (Lua 5.1) and for Lua 5.4 (prints TAP).
#
# Runs README's block install-dist as printed, with its tree /opt/fuse replaced by a temp
# directory, and without a network when `unshare -rn` works here (a new network
# namespace holds only a loopback that is down: any download fails). Then requires fuse
# from that tree, and only from it, under luajit and lua5.4, and makes a call.
# A missing tool skips ("ok # SKIP"); under CI (CI=true) that fails. KEEP=1 keeps the
# temp directory.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LUAJIT=${LUAJIT:-luajit}
LUA54=${LUA54:-lua5.4}
LUAROCKS=${LUAROCKS:-luarocks}

# shellcheck source=test/lib/tap.sh
. "$ROOT/test/lib/tap.sh"   # ok, nok, diag, check, bail, skip, skip_all

echo "TAP version 13"
TESTS=(
  "install-dist: README's block runs as printed (make dist, two offline installs)"
  "the tree holds fuse.lua and fuse/core.so for Lua 5.1 and for Lua 5.4"
  "luajit: fuse comes from the tree, on the ffi backend, and a breaker works"
  "lua5.4: fuse comes from the tree, on the capi backend, and a breaker works"
)
why=
for tool in "$LUAROCKS" zip "$LUAJIT" "$LUA54"; do
  command -v "$tool" >/dev/null || { why="$tool not installed"; break; }
done
if [ -n "$why" ]; then
  for t in "${TESTS[@]}"; do skip "$t" "$why"; done
  echo "1..$n"
  [ "$failed" -eq 0 ]
  exit
fi

T=$(mktemp -d /tmp/fuse-dist-test.XXXXXX) || { echo "Bail out! mktemp failed"; exit 1; }
cleanup() { if [ "${KEEP:-0}" = 1 ]; then echo "# kept $T" >&2; else rm -rf "$T"; fi; }
trap cleanup EXIT
TREE=$T/tree

offline=()
if unshare -rn true 2>/dev/null; then
  offline=(unshare -rn)
  diag "offline: luarocks runs in a network namespace of its own (unshare -rn)"
else
  # no namespaces here: point every download at a port nothing listens on
  export http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 ftp_proxy=http://127.0.0.1:9
  diag "offline: unshare -rn is not allowed here; downloads go to a dead proxy instead"
fi

# the version the rock must report: the rockspec's, without its revision
VERSION=$(sed -n 's/^version *= *"\([^"-]*\)-[0-9]*".*/\1/p' "$ROOT"/*.rockspec)
"$ROOT/tools/readme-block" install-dist | sed "s|/opt/fuse|$TREE|g" > "$T/install.sh"
if (cd "$ROOT" && "${offline[@]}" bash -e "$T/install.sh") > "$T/install.out" 2>&1 &&
   [ -n "$VERSION" ] && [ "$(tail -n 1 "$T/install.out")" = "$VERSION" ]; then
  ok "${TESTS[0]}"
else
  nok "${TESTS[0]}"; diag "$(tail -n 30 "$T/install.out")"
fi

have=0
[ -r "$TREE/share/lua/5.1/fuse.lua" ] && [ -r "$TREE/lib/lua/5.1/fuse/core.so" ] &&
  [ -r "$TREE/share/lua/5.4/fuse.lua" ] && [ -r "$TREE/lib/lua/5.4/fuse/core.so" ] && have=1
if [ "$have" = 1 ]; then ok "${TESTS[1]}"
else nok "${TESTS[1]}"; diag "$(find "$TREE" -name 'fuse*' 2>/dev/null)"; fi

# Runs in the tree's paths only (LUA_PATH and LUA_CPATH from luarocks, no ";;"), so
# nothing can come from the working tree or the system.
CHECK='
  local tree, backend = os.getenv("TREE"), os.getenv("BACKEND")
  local fuse = require "fuse"
  local from = package.searchpath("fuse", package.path)
  local core = package.searchpath("fuse.core", package.cpath)
  assert(from and from:sub(1, #tree) == tree, "fuse came from " .. tostring(from))
  assert(core and core:sub(1, #tree) == tree, "fuse.core is not in the tree: " .. tostring(core))
  assert(fuse._backend == backend, "backend " .. tostring(fuse._backend))
  local f, b = fuse.wrap(function() return nil, "down" end, { fails = 2 })
  f(); f()
  local _, err = f()
  assert(b:state() == "open" and fuse.is_rejection(err), "the breaker did not open")
  print("ok " .. fuse.VERSION .. " " .. fuse._backend .. " " .. core)'
# tree_lua VERSION LUA BACKEND: CHECK under LUA with the tree's paths for VERSION
tree_lua() {
  local lp lc
  lp=$("$LUAROCKS" --lua-version="$1" --tree "$TREE" path --lr-path) || return 1
  lc=$("$LUAROCKS" --lua-version="$1" --tree "$TREE" path --lr-cpath) || return 1
  LUA_PATH=$lp LUA_CPATH=$lc TREE=$TREE BACKEND=$3 "$2" -e "$CHECK"
}
for row in "2 5.1 $LUAJIT ffi" "3 5.4 $LUA54 capi"; do
  # shellcheck disable=SC2086  # split the row into its fields
  # shellcheck disable=SC2086  # the row splits into its fields
  set -- $row
  if out=$(tree_lua "$2" "$3" "$4" 2>&1); then ok "${TESTS[$1]}"; diag "$out"
  else nok "${TESTS[$1]}"; diag "$out"; fi
done

echo "1..$n"
[ "$failed" -eq 0 ]
