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
  1/*"not ok 1 - cannot run under CI: nginx not installed"*) ok "nginx.t.sh without nginx under CI=true: not ok, exit 1" ;;
  *) nok "nginx.t.sh without nginx under CI=true: not ok, exit 1"; diag "exit $rc" "$out" ;;
esac
out=$(env -u CI NGINX=/nonexistent/nginx bash "$ROOT/test/nginx.t.sh" 2>&1); rc=$?
case $rc/$out in
  0/*"1..0 # SKIP nginx not installed"*) ok "nginx.t.sh without nginx outside CI: a skip plan, 1..0" ;;
  *) nok "nginx.t.sh without nginx outside CI: a skip plan, 1..0"; diag "exit $rc" "$out" ;;
esac

# ---------------------------------------------------------------- nginx in /usr/sbin
# Debian's PATH for users other than root has no /usr/sbin, where nginx is. Each script
# that starts nginx picks it with its NGINX= line (after sourcing test/lib/nginx.sh, whose
# nginx_bin the line may call): run that line with such a PATH.
if [ -x /usr/sbin/nginx ]; then
  for f in test/*.t.sh examples/nginx/demo.sh; do
    grep -q '^NGINX=' "$ROOT/$f" || continue
    line=$(grep -m 1 '^NGINX=' "$ROOT/$f")
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
