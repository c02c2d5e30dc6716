#!/usr/bin/env bash
# test/packaging.t.sh -- what a new user on a fresh Debian machine meets (prints TAP):
# tools/tapsum names skipped suites and fails them under CI, the scripts find nginx in
# /usr/sbin when it is not on PATH, `make deps` installs without recommended packages and
# knows every package the tests and demos use, and the Makefile names no missing file.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/tap.sh
. "$ROOT/test/lib/tap.sh"   # ok, nok, diag, check, bail, skip, skip_all

echo "TAP version 13"
T=$(mktemp -d /tmp/fuse-packaging-test.XXXXXX) || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$T"' EXIT

# ---------------------------------------------------------------- tools/tapsum and skips
L=$T/logs
mkdir -p "$L"
printf 'TAP version 13\nok 1 - a\nok 2 - b\n1..2\n' > "$L/core.tap"
printf 'TAP version 13\n1..0 # SKIP nginx not installed\n' > "$L/nginx.tap"
printf 'ok 1 - a\nok 2 - b # SKIP needs LuaJIT\n1..2\n' > "$L/specs.tap"
for s in core nginx specs; do echo 0 > "$L/$s.rc"; done

out=$(env -u CI sh "$ROOT/tools/tapsum" "$L"); rc=$?
last=$(printf '%s\n' "$out" | tail -n 1)
before=$(printf '%s\n' "$out" | tail -n 2 | head -n 1)
check "tapsum: the last line stays exactly 'N passed, N failed'" [ "$last" = "4 passed, 0 failed" ]
check "tapsum: the line before it names the skipped suite and why" \
  [ "$before" = "1 suites skipped: nginx (nginx not installed)" ]
check "tapsum: a skipped suite alone is not a failure outside CI (exit 0)" [ "$rc" = 0 ]
case $out in *"specs            2 ok (1 skipped)"*) ok "tapsum: a suite's line counts its skipped tests" ;;
  *) nok "tapsum: a suite's line counts its skipped tests" ;; esac
[ "$failed" -eq 0 ] || diag "$out"

out=$(CI=true sh "$ROOT/tools/tapsum" "$L"); rc=$?
last=$(printf '%s\n' "$out" | tail -n 1)
check "tapsum under CI=true: a skipped suite is a failure" [ "$last/$rc" = "4 passed, 1 failed/1" ]
case $out in *"nginx"*"skipped under CI: nginx not installed"*) ok "tapsum under CI=true: says which and why" ;;
  *) nok "tapsum under CI=true: says which and why"; diag "$out" ;; esac

# the suites' own skip: nginx.t.sh without nginx, under CI, fails
out=$(CI=true NGINX=/nonexistent/nginx bash "$ROOT/test/nginx.t.sh" 2>&1); rc=$?
case $rc/$out in
  1/*"not ok 1 - cannot run under CI: nginx is not installed"*) ok "nginx.t.sh without nginx under CI=true: not ok, exit 1" ;;
  *) nok "nginx.t.sh without nginx under CI=true: not ok, exit 1"; diag "exit $rc" "$out" ;;
esac
out=$(env -u CI NGINX=/nonexistent/nginx bash "$ROOT/test/nginx.t.sh" 2>&1); rc=$?
case $rc/$out in
  0/*"1..0 # SKIP nginx is not installed"*) ok "nginx.t.sh without nginx outside CI: a skip plan, 1..0" ;;
  *) nok "nginx.t.sh without nginx outside CI: a skip plan, 1..0"; diag "exit $rc" "$out" ;;
esac

# ---------------------------------------------------------------- nginx in /usr/sbin
# Debian's PATH for users other than root has no /usr/sbin, where nginx is. Each script
# that starts nginx picks it with its NGINX= line (after sourcing test/lib/nginx.sh, whose
# nginx_bin the line may call), or with nginx_suite (the nginx suites): run that line, or
# the suite's nginx_suite line (its temp directory removed after), with such a PATH.
if [ -x /usr/sbin/nginx ]; then
  for f in test/*.t.sh examples/nginx/demo.sh; do
    if grep -q '^nginx_suite ' "$ROOT/$f"; then
      line='. "$(dirname "$0")/tap.sh"; nginx_suite packaging-probe >/dev/null; rm -rf "$T"'
    else
      grep -q '^NGINX=' "$ROOT/$f" || continue
      line=$(grep -m 1 '^NGINX=' "$ROOT/$f")
    fi
    got=$(env -u NGINX PATH=/usr/local/bin:/usr/bin:/bin \
      bash -c ". \"\$0\"; $line"'; echo "$NGINX"' "$ROOT/test/lib/nginx.sh")
    check "$f finds nginx in /usr/sbin with a user's PATH" [ "$got" = /usr/sbin/nginx ]
    [ "$got" = /usr/sbin/nginx ] || diag "its line: $line" "gives: $got"
  done
elif [ "${CI:-}" = true ]; then
  nok "nginx in /usr/sbin (cannot run under CI: /usr/sbin/nginx is not installed)"
else
  ok "nginx in /usr/sbin # SKIP /usr/sbin/nginx is not installed"
fi

# ---------------------------------------------------------------- make deps
pkgs=$(make -s -C "$ROOT" -f Makefile -f - print-deb-pkgs <<'EOF'
print-deb-pkgs: ; @echo $(DEB_PKGS)
EOF
)
missing=""
for p in procps lua-cjson apache2-utils zip curl nginx libnginx-mod-http-lua prometheus; do
  case " $pkgs " in *" $p "*) ;; *) missing="$missing $p" ;; esac
done
check "DEB_PKGS has procps, lua-cjson, apache2-utils, zip (and the rest)" [ -z "$missing" ]
[ -z "$missing" ] || diag "missing:$missing" "DEB_PKGS: $pkgs"
recipe=$(make -n -s -C "$ROOT" deps 2>/dev/null)
case $recipe in
  *"install -y --no-install-recommends \$missing"*|*"install -y --no-install-recommends "*)
    ok "make deps installs with --no-install-recommends" ;;
  *) nok "make deps installs with --no-install-recommends"; diag "$recipe" ;;
esac
case $recipe in
  *"install -y "[!-]*) nok "make deps: no apt-get install without --no-install-recommends"; diag "$recipe" ;;
  *) ok "make deps: no apt-get install without --no-install-recommends" ;;
esac

# a package removed but not purged ("config-files") is missing, as is one never installed
mkdir -p "$T/bin"
cat > "$T/bin/dpkg-query" <<'EOF'
#!/bin/sh
# a stand-in: prints ${db:Status-Status} for the last argument
case $3 in
  ok-pkg) printf installed ;;
  removed-pkg) printf config-files ;;
  half-pkg) printf half-configured ;;
  *) echo "dpkg-query: no packages found matching $3" >&2; exit 1 ;;
esac
EOF
chmod +x "$T/bin/dpkg-query"
got=$(PATH="$T/bin:$PATH" sh "$ROOT/tools/debs-missing" ok-pkg removed-pkg half-pkg gone-pkg | tr '\n' ' ')
check "make deps (tools/debs-missing): removed-not-purged, half-configured and absent packages are missing" \
  [ "$got" = "removed-pkg half-pkg gone-pkg " ]
[ "$got" = "removed-pkg half-pkg gone-pkg " ] || diag "missing: $got"
case $recipe in
  *debs-missing*) ok "make deps asks tools/debs-missing, before and after installing" ;;
  *) nok "make deps asks tools/debs-missing, before and after installing"; diag "$recipe" ;;
esac

# ---------------------------------------------------------------- the summary is last
printf 'TAP version 13\nok 1 - a\n1..1\n' > "$L/good.tap"; echo 0 > "$L/good.rc"
printf 'TAP version 13\nnot ok 1 - b\n1..1\n' > "$L/bad.tap"; echo 1 > "$L/bad.rc"
rm -f "$L/nginx.tap" "$L/nginx.rc" "$L/specs.tap" "$L/specs.rc" "$L/core.tap" "$L/core.rc"
out=$(env -u CI -u MAKEFLAGS -u MAKELEVEL make --no-print-directory -C "$ROOT" summary LOGDIR="$L" 2>&1); rc=$?
tail2=$(printf '%s\n' "$out" | tail -n 2 | tr '\n' '|')
case $rc/$tail2 in
  [1-9]*/"1 passed, 1 failed|make: *** [Makefile:"*": summary] Error 1|")
    ok "a failed run ends with 'N passed, N failed', then make's one line, as README says" ;;
  *) nok "a failed run ends with 'N passed, N failed', then make's one line, as README says"; diag "exit $rc" "$out" ;;
esac
recipe_test=$(env -u MAKEFLAGS -u MAKELEVEL make -n -s -C "$ROOT" test 2>/dev/null | tail -n 1)
check "make test's last step is tools/tapsum (no recursive make after it)" \
  [ "$recipe_test" = "sh tools/tapsum build/test-logs" ]
[ "$recipe_test" = "sh tools/tapsum build/test-logs" ] || diag "last step: $recipe_test"

# ---------------------------------------------------------------- the test ports
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
inrange=1
for _ in $(seq 20); do
  p=$(FUSE_TEST_PORTS=25000-25019 pick_ports 4) || { inrange=0; break; }
  [ "$p" -ge 25000 ] && [ $((p + 3)) -le 25019 ] || { inrange=0; diag "picked $p"; }
done
check "FUSE_TEST_PORTS=25000-25019: every port picked (4 in a row) is inside it" [ $inrange = 1 ]
FUSE_TEST_PORTS=100-50 pick_ports 1 > /dev/null 2> "$T/ports.err"; rc=$?
refused() { [ "$rc" != 0 ] && grep -q "FUSE_TEST_PORTS must be LOW-HIGH" "$T/ports.err"; }
check "FUSE_TEST_PORTS that is not LOW-HIGH: an error that says so" refused
check "README documents FUSE_TEST_PORTS=LOW-HIGH and the default range 10000-29999" \
  [ "$(grep -c 'FUSE_TEST_PORTS=LOW-HIGH' "$ROOT/README.md")/$(grep -c '10000-29999' "$ROOT/README.md")" = 1/1 ]

check "README describes make stress-test" grep -q '`make stress-test` runs the nginx suites' "$ROOT/README.md"

# ---------------------------------------------------------------- README's OpenResty block
k=$("$ROOT/tools/readme-block" openresty-conf | grep -c '/path/to/fuse')
two_lines() { [ "$k" = 2 ] && grep -q 'on the two `lua_package_\*` lines' "$ROOT/README.md"; }
check "README's OpenResty block holds /path/to/fuse on exactly the two lines its text names" two_lines

# ---------------------------------------------------------------- README and docs/
out=$("$ROOT/tools/check-doc-links" "$ROOT" 2>&1); rc=$?
check "README.md has at most 400 lines, links every docs/*.md page, and no relative link of README.md or docs/*.md points to a missing file or heading" \
  [ "$rc" = 0 ]
[ "$rc" = 0 ] || diag "$out"
# tools/check-doc-links finds what is wrong: a README of 401 lines, a page not linked, a
# link to a missing file, a link to a missing heading
B=$T/doclinks
mkdir -p "$B/docs"
cp "$ROOT/README.md" "$B/"
cp "$ROOT"/docs/*.md "$B/docs/"
broken() { ! "$ROOT/tools/check-doc-links" "$B" > "$B/out" 2>&1 && grep -q "$1" "$B/out"; }
seq 401 > "$B/README.md"
check "check-doc-links refuses a README of 401 lines" broken "401 lines, more than 400"
cp "$ROOT/README.md" "$B/"
echo "# new" > "$B/docs/new-page.md"
check "check-doc-links refuses a docs/ page that README does not link" broken "no link to docs/new-page.md"
rm "$B/docs/new-page.md"
echo "See [gone](gone.md) and [here](api.md#no-such-heading)." >> "$B/docs/tests.md"
check "check-doc-links refuses a link to a missing file" broken "docs/gone.md is missing"
check "check-doc-links refuses a link to a missing heading" broken "no heading #no-such-heading"
same_install() { [ "$("$ROOT/tools/readme-block" install-dist)" = "$("$ROOT/tools/readme-block" install-dist "$ROOT/docs/install.md")" ]; }
check "docs/install.md's install-dist block is README's (which test/dist.t.sh runs)" same_install

# ---------------------------------------------------------------- the suites' own checks
# `check DESC [ a ] && [ b ]` checks [ a ] alone: the && belongs to the caller, and a
# false [ b ] would pass unseen. A condition of several commands goes in a function.
bad=$(cd "$ROOT" && awk '{ line = $0; while (line ~ /\\$/ && (getline nx) > 0) { sub(/\\$/, "", line); line = line nx }
  if (line !~ /^[ \t]*check "/) next
  bare = line; gsub(/"([^"\\]|\\.)*"/, "", bare); gsub(/'\''[^'\'']*'\''/, "", bare)   # quoted text is no operator
  if (bare ~ /&&|\|\|/) print FILENAME ": " substr(line, 1, 100) }' \
  test/*.t.sh)
check "no suite's check is followed by && or || (which it would not check)" [ -z "$bad" ]
[ -z "$bad" ] || diag "$bad"

# ---------------------------------------------------------------- files the Makefile names
absent=""
for f in $(grep -oE '\b(notes|docs|tools|test|spec|examples|bench|csrc|lua)/[A-Za-z0-9_./-]+\.[a-z]+' \
           "$ROOT/Makefile" | grep -v '[*%$]' | grep -v '\.tmp$' | sort -u); do
  [ -e "$ROOT/$f" ] || absent="$absent $f"
done
check "every file the Makefile names exists (no notes/API.md)" [ -z "$absent" ]
[ -z "$absent" ] || diag "absent:$absent"

echo "1..$n"
[ "$failed" -eq 0 ]
