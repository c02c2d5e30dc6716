#!/bin/sh
# checkcdef.sh [--tap]: fails, saying why, when
#   - lua/fuse/cdef.lua differs from what tools/gencdef.sh makes of csrc/fz.h now
#     (run `make cdef`), or
#   - the functions build/fuse/core.so exports (nm -D --defined-only) are not exactly
#     the functions declared in the FZ_CDEF region of csrc/fz.h, luaopen_* aside.
# With --tap it prints the verdict as one TAP test, the reasons as "#" lines.
set -u

header=csrc/fz.h
cdef=lua/fuse/cdef.lua
so=build/fuse/core.so
tap=0
[ "${1:-}" = "--tap" ] && tap=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
problems=0
say() { if [ $tap = 1 ]; then echo "# $*"; else echo "check-cdef: $*" >&2; fi; }
problem() { say "$@"; problems=$((problems + 1)); }

# 1. the generated file is fresh
if ! sh tools/gencdef.sh "$header" > "$tmp/cdef.lua" 2> "$tmp/gen.err"; then
  problem "tools/gencdef.sh failed: $(cat "$tmp/gen.err")"
elif [ ! -f "$cdef" ]; then
  problem "$cdef is missing: run \`make cdef\`"
elif ! cmp -s "$tmp/cdef.lua" "$cdef"; then
  problem "$cdef is stale (csrc/fz.h changed since): run \`make cdef\`"
  diff -u "$cdef" "$tmp/cdef.lua" | head -n 40 | sed 's/^/#   /' > "$tmp/diff"
  if [ $tap = 1 ]; then cat "$tmp/diff"; else cat "$tmp/diff" >&2; fi
fi

# 2. the exports match the declarations: a name followed by "(" in the region.
awk '/^[ \t]*\/\* FZ_CDEF_BEGIN \*\/[ \t]*$/ { on = 1; next }
     /^[ \t]*\/\* FZ_CDEF_END \*\/[ \t]*$/ { on = 0 } on' "$header" |
  sed 's,/\*.*\*/,,g' |
  grep -oE '[A-Za-z_][A-Za-z0-9_]*[[:space:]]*\(' | sed 's/[[:space:]]*($//' |
  sort -u > "$tmp/declared"
if [ ! -f "$so" ]; then
  problem "$so is missing: run \`make\`"
elif ! nm -D --defined-only "$so" > "$tmp/nm" 2> "$tmp/nm.err"; then
  problem "nm -D failed on $so: $(cat "$tmp/nm.err")"
else
  # Defined dynamic symbols, minus the linker's own and the Lua C API entry points.
  awk 'NF >= 3 { print $3 }' "$tmp/nm" |
    grep -vE '^(_init|_fini|_edata|_end|__bss_start|luaopen_.*)$' | sort -u > "$tmp/exported"
  missing=$(comm -23 "$tmp/declared" "$tmp/exported" | paste -sd ' ' -)
  extra=$(comm -13 "$tmp/declared" "$tmp/exported" | paste -sd ' ' -)
  [ -n "$missing" ] && problem "declared in the cdef region of $header but not exported by $so: $missing"
  [ -n "$extra" ] && problem "exported by $so but not declared in the cdef region of $header: $extra"
  [ -s "$tmp/declared" ] || problem "found no function declared in the cdef region of $header"
fi

if [ $tap = 1 ]; then
  echo "1..1"
  n=$(wc -l < "$tmp/declared")
  desc="lua/fuse/cdef.lua is fresh and core.so exports exactly its $((n)) functions"
  if [ $problems = 0 ]; then echo "ok 1 - $desc"; else echo "not ok 1 - $desc"; fi
elif [ $problems = 0 ]; then
  echo "check-cdef: ok ($cdef is fresh; $so exports the $(wc -l < "$tmp/declared") declared functions)"
fi
[ $problems = 0 ]
