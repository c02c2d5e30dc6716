#!/bin/sh
# gencdef.sh [HEADER]: prints lua/fuse/cdef.lua, the LuaJIT FFI declarations of the
# core, made from the lines of HEADER (default csrc/fz.h) between the lines
# "/* FZ_CDEF_BEGIN */" and "/* FZ_CDEF_END */", and the ABI version from
# "#define FZ_ABI_VERSION N". `make cdef` writes the result; `make check-cdef`
# compares it with the committed file. Fails, printing why, when the header lacks
# the markers or the version, or the region holds what ffi.cdef cannot parse.
set -eu

header=${1:-csrc/fz.h}
[ -r "$header" ] || { echo "gencdef: cannot read $header" >&2; exit 1; }

awk -v header="$header" '
function fail(msg) { print "gencdef: " header ":" FNR ": " msg > "/dev/stderr"; bad = 1; exit 1 }

/^[ \t]*\/\* FZ_CDEF_BEGIN \*\/[ \t]*$/ {
  if (begun) fail("a second FZ_CDEF_BEGIN")
  begun = 1; inside = 1; next
}
/^[ \t]*\/\* FZ_CDEF_END \*\/[ \t]*$/ {
  if (!inside) fail("FZ_CDEF_END without FZ_CDEF_BEGIN")
  inside = 0; ended = 1; next
}
inside {
  # ffi.cdef has no preprocessor, and the region is wrapped in a [=[ ]=] string.
  if ($0 ~ /^[ \t]*#/) fail("preprocessor line inside the cdef region: " $0)
  if (index($0, "]=]")) fail("\"]=]\" inside the cdef region")
  body = body $0 "\n"
  next
}
$1 == "#define" && $2 == "FZ_ABI_VERSION" {
  if ($3 !~ /^[0-9]+$/) fail("FZ_ABI_VERSION is not a plain integer: " $3)
  abi = $3
}
END {
  if (bad) exit 1
  if (!begun) fail("no FZ_CDEF_BEGIN line")
  if (!ended) fail("FZ_CDEF_BEGIN without FZ_CDEF_END")
  if (abi == "") fail("no \"#define FZ_ABI_VERSION N\" line")
  print "-- generated from csrc/fz.h by make cdef: do not edit"
  print "-- (edit the FZ_CDEF region of csrc/fz.h, then run `make cdef`)"
  print "return {"
  print "  abi = " abi ","
  printf "  cdef = [=[\n%s]=],\n", body
  print "}"
}
' "$header"
