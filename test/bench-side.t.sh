#!/usr/bin/env bash
# test/bench-side.t.sh -- the side-by-side bench of bench/README.md runs (prints TAP).
#
# `make bench-side BASE=HEAD` as bench/README.md shows it (`make bench BASE=<rev>` runs
# the same target), in its smoke form (SIDE_ROUNDS=1, SIDE_FLAGS="--quick
# --no-callgrind"): it builds HEAD from git into build/base/<commit>/, which git ignores,
# and prints a row for every case it compares. Then bench/instr.lua, the loop that
# callgrind counts, gives the expected sum for each case, and, with valgrind installed
# (the bench's tool, which make deps does not install), callgrind counts one. No figure is judged: timing is the bench's business, not a test's.
# Outside a git checkout (a source rock), the suite skips.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LUAJIT=${LUAJIT:-luajit}
MAKE=${MAKE:-make}

# shellcheck source=test/lib/tap.sh
. "$ROOT/test/lib/tap.sh"   # ok, nok, diag, check, bail, skip, skip_all

echo "TAP version 13"
command -v "$LUAJIT" >/dev/null || skip_all "$LUAJIT not installed"
command -v git >/dev/null || skip_all "git not installed"
rev=$(git -C "$ROOT" rev-parse --verify --quiet 'HEAD^{commit}') || skip_all "not a git checkout"

T=$(mktemp -d /tmp/fuse-bench-side.XXXXXX) || bail "mktemp failed"
base="$ROOT/build/base/$rev"
made=0
[ -e "$base" ] || made=1  # then the build of HEAD is the test's, removed at the end
cleanup() {
  rm -rf "$T"
  if [ "$made" = 1 ]; then rm -rf "$base" "$base.log"; fi
}
trap cleanup EXIT

if "$MAKE" --no-print-directory -C "$ROOT" bench-side BASE=HEAD SIDE_ROUNDS=1 \
    SIDE_FLAGS="--quick --no-callgrind" >"$T/side.out" 2>&1; then
  ok "make bench-side BASE=HEAD (one quick round) runs"
else
  nok "make bench-side BASE=HEAD (one quick round) runs"
  diag "$(tail -n 30 "$T/side.out")"
fi

rows=0
for c in "closed call" "open rejection" "forced_open rejection" "allow [+] report"; do
  # the case, two times, a difference, a ratio and a verdict on its target
  if grep -Eq "^$c +[0-9.]+ \([0-9.]+\) +[0-9.]+ \([0-9.]+\) +[-+][0-9.]+ +[0-9.]+ .*: (met|NOT met)$" \
      "$T/side.out"; then
    rows=$((rows + 1))
  else
    diag "no row for '$c'"
  fi
done
check "it prints a row with a target for each of the 4 compared cases" [ "$rows" -eq 4 ]
check "it names the base it built: HEAD and its commit" grep -q "base HEAD ($rev)" "$T/side.out"
check "the base tree is built from git under build/base/<commit>" \
  test -f "$base/build/fuse/core.so"
check "build/base is ignored by git (the old tree is never committed)" \
  git -C "$ROOT" check-ignore -q "$base/lua/fuse.lua"

export LUA_PATH="$ROOT/lua/?.lua;$ROOT/lua/?/init.lua;;" LUA_CPATH="$ROOT/build/?.so;;"
for c in allow+report closed open forced_open; do
  want=1000
  [ "$c" = closed ] && want=501500  # sum of i + 1 for i = 1..1000
  got=$("$LUAJIT" "$ROOT/bench/instr.lua" "$c" 1000 2>&1)
  check "bench/instr.lua $c 1000 sums $want (got: $got)" [ "$got" = "$want" ]
done

if command -v valgrind >/dev/null; then
  v=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$LUAJIT" "$ROOT/bench/instr.lua" \
    allow+report 1000 2>&1 >/dev/null | sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
  check "callgrind counts the instructions of bench/instr.lua allow+report (got: ${v:-none})" \
    test "${v:-0}" -gt 0
else
  # valgrind is the bench's, not a dependency of the project (make deps leaves it out)
  diag "valgrind not installed: the callgrind count is not checked"
fi

echo "1..$n"
[ "$failed" -eq 0 ]
