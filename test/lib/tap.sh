# shellcheck shell=bash
# test/lib/tap.sh -- the TAP helpers of the shell suites (test/*.t.sh); sourced, never run:
#     . "$ROOT/test/lib/tap.sh"
# It sets n=0 failed=0 and defines:
#   ok DESC, nok DESC      a result line ("ok N - DESC", "not ok N - DESC"); n counts
#                          them, failed the failures
#   diag LINE...           "# " comment lines
#   check DESC CMD...      ok DESC when CMD succeeds, else nok DESC
#   bail WHY               "Bail out! WHY", exit 1
#   skip DESC WHY          a test that cannot run here: "ok N - DESC # SKIP WHY"; under
#                          CI (CI=true) that is a failure
#   skip_all WHY           the suite cannot run here: a skip plan ("1..0 # SKIP WHY"),
#                          exit 0; under CI a failure ("not ok 1 - cannot run under CI"), exit 1
# A suite ends with: echo "1..$n"; [ "$failed" -eq 0 ]

n=0 failed=0
ok()   { n=$((n + 1)); echo "ok $n - $1"; }
nok()  { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; }
diag() { printf '%s\n' "$@" | sed 's/^/# /'; }
check() { local d=$1; shift; if "$@"; then ok "$d"; else nok "$d"; fi; }
bail() { echo "Bail out! $*"; exit 1; }
skip() {
  if [ "${CI:-}" = true ]; then nok "$1 (cannot run under CI: $2)"
  else ok "$1 # SKIP $2"; fi
}
skip_all() {
  if [ "${CI:-}" = true ]; then echo "1..1"; echo "not ok 1 - cannot run under CI: $1"; exit 1; fi
  echo "1..0 # SKIP $1"; exit 0
}
