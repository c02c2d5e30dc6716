#!/usr/bin/env bash
# test/admin.t.sh -- the admin endpoint under a real nginx (prints TAP): what refuses a
# POST, the GET's forms, UTF-8 JSON for any name, a form too large.
#
# Starts nginx with 2 workers in a temp prefix, on free loopback ports: README's
# admin-listener block as printed (its token, its allow/deny; only the port replaced),
# a listener with fuse.admin() and no token, and a front server whose /keyed makes a
# breaker named by its ?name= (the bytes, percent-decoded: a gateway keyed by a request
# field). init_by_lua makes 2500 breakers "bulk-NNNN" and "twostep" in the shared
# registry. Checks, each request and its expected answer in one place:
#   POST with a browser's cross-site marks (Origin, Sec-Fetch-Site): 403, even with the
#   token; without the token or with another: 403; with it: 200; fuse.admin() without
#   a token: GET 200, every POST 403;
#   GET ?name= (404 unknown), ?state= (400 unknown), pages of 100 / ?limit= / ?after=
#   that list every breaker once; a name with the byte 0xE9 (/keyed?name=caf%E9) gives
#   JSON that is valid UTF-8 (iconv) and that cjson reads as "caf\xE9", on every page;
#   a POST of a 20 kB form: 413 with a JSON error, nothing changed; a POST of a JSON body,
#   or with its fields in the query string: 400 saying so (not "missing name"); a field
#   mistyped (POST second=30, GET ?stat=open): 400 naming it; a field given twice
#   (name=a&name=b, action=reset&action=force_open), a POST without an action, an empty
#   ?name=: 400 saying so; DELETE: 405, Allow with HEAD.
# Needs nginx with the Lua module, curl, iconv and luajit with lua-cjson; without one
# it skips, except under CI=true, where it fails. About 3 s; a watchdog stops it after
# 120 s. KEEP=1 keeps the temp prefix.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
# shellcheck source=test/lib/tap.sh
. "$ROOT/test/lib/tap.sh"   # ok, nok, diag, check, bail, skip, skip_all
LUAJIT=${LUAJIT:-luajit}
nginx_suite admin curl iconv cjson

# ---------------------------------------------------------------- setup
MASTER=
trap 'cleanup_nginx "${MASTER:-$(cat "$T/logs/nginx.pid" 2>/dev/null)}"' EXIT
watchdog 120

mkdir -p "$T/logs" "$T/temp"
copy_fuse "$T" "$LUA_SRC" "$SO_SRC"
"$ROOT/tools/readme-block" admin-listener > "$T/admin.block" || bail "README has no admin-listener block"
TOKEN=$(sed -n 's/.*admin{ token = "\([^"]*\)" }.*/\1/p' "$T/admin.block")
[ -n "$TOKEN" ] || bail "README's admin-listener block has no fuse.admin{ token = \"...\" }"
chmod -R a+rX "$T"

render_conf() { # ports PORT (front), PORT + 1 (README's admin listener), PORT + 2 (no token)
  FRONT=$PORT ADMIN=$((PORT + 1)) OPEN=$((PORT + 2))
  {
    nginx_load_modules
    cat <<EOF
worker_processes 2;
pid logs/nginx.pid;
error_log logs/error.log warn;
events { worker_connections 64; }
http {
    access_log logs/access.log;
$(nginx_temp_paths)
$(nginx_lua_paths "$T")
    init_by_lua_block {
        local fuse = require "fuse"
        fuse.init{ shared = true, capacity = 4096 }
        for i = 1, 2500 do fuse.new{ name = ("bulk-%04d"):format(i), fails = 3 } end
        fuse.new{ name = "twostep", fails = 3 }
    }
    server {
        listen 127.0.0.1:$FRONT;
        location = /keyed {
            content_by_lua_block {
                local b = require("fuse").new{ name = ngx.req.get_uri_args().name, fails = 3 }
                ngx.say(#b.name)
            }
        }
    }
    server {
        listen 127.0.0.1:$OPEN;
        location = /fuse {
            content_by_lua_block { require("fuse").admin() }
        }
    }
EOF
    sed "s/127\.0\.0\.1:9145/127.0.0.1:$ADMIN/g" "$T/admin.block"
    echo "}"
  } > "$T/nginx.conf"
  chmod a+r "$T/nginx.conf"
}
start_rendered 3 render_conf "$T" || bail "nginx did not start: $NGINX_START_ERR"
MASTER=$(cat "$T/logs/nginx.pid" 2>/dev/null)

# req PORT PATH [curl args...] -> CODE, BODY (the body also in $T/body)
req() {
  local port=$1 path=$2; shift 2
  CODE=$(curl -s -m 10 -o "$T/body" -w '%{http_code}' "$@" "http://127.0.0.1:$port$path")
  BODY=$(cat "$T/body" 2>/dev/null)
}
admin() { req "$ADMIN" "$@"; }
AUTH="Authorization: Bearer $TOKEN"
# json EXPR: the Lua expression EXPR over `j`, $T/body decoded by lua-cjson ("error: ..."
# when it is not JSON)
json() {
  EXPR=$1 "$LUAJIT" -e '
    local cjson = require "cjson.safe"
    local j, err = cjson.decode(io.read("*a"))
    if j == nil then return print("error: " .. tostring(err)) end
    local ok, v = pcall(assert(loadstring("local j = ...; return " .. os.getenv("EXPR"))), j)
    print(ok and tostring(v) or "error: " .. tostring(v))' < "$T/body"
}
utf8_ok() { iconv -f UTF-8 -t UTF-8 "$T/body" > /dev/null 2>&1; }
state_of() { admin '/fuse?name=twostep'; json 'j.state'; } # twostep's state, by GET

wait_for 10 curl -s -o /dev/null -m 1 "http://127.0.0.1:$ADMIN/fuse" || bail "the admin listener does not answer"
admin /fuse
check "nginx runs README's admin listener as printed (its token): GET 200, JSON" \
  [ "$CODE/$(json 'type(j.breakers)')" = "200/table" ]

# ---------------------------------------------------------------- POST: what refuses it
FORM='name=twostep&action=force_open'
refused_ok=1
while IFS='|' read -r what h1 h2; do
  args=(-H "$AUTH" -d "$FORM")
  [ -n "$h1" ] && args+=(-H "$h1")
  [ -n "$h2" ] && args+=(-H "$h2")
  admin /fuse "${args[@]}"
  e=$(json 'j.error')
  case "$CODE/$e" in
    "403/a browser's request from another site"*) ;;
    *) refused_ok=0; diag "$what: $CODE $BODY (want 403, a browser's request from another site)" ;;
  esac
done <<EOF
a form on another site|Origin: http://evil.example|Sec-Fetch-Site: cross-site
Origin of another site|Origin: http://evil.example|
Sec-Fetch-Site cross-site|Sec-Fetch-Site: cross-site|
a page on another port of this host|Origin: http://127.0.0.1:$FRONT|Sec-Fetch-Site: same-site
a sandboxed frame|Origin: null|
EOF
check "a POST with a browser's cross-site marks is 403, even with the token" [ $refused_ok = 1 ]
check "... and twostep is still closed" [ "$(state_of)" = closed ]

token_ok=1
for h in "" "Authorization: Bearer wrong-token-0123456789" "Authorization: Bearer ${TOKEN}x" \
         "Authorization: Basic $TOKEN"; do
  if [ -n "$h" ]; then admin /fuse -H "$h" -d "$FORM"; else admin /fuse -d "$FORM"; fi
  e=$(json 'j.error')
  case "$CODE/$e" in
    "403/POST needs \"Authorization: Bearer <token>\" with fuse.admin's token") ;;
    *) token_ok=0; diag "POST with '${h:-no Authorization}': $CODE $BODY (want 403)" ;;
  esac
done
check "a POST without the token, or with another one, is 403" [ $token_ok = 1 ]
check "... and twostep is still closed" [ "$(state_of)" = closed ]

admin /fuse -H "$AUTH" -d "$FORM"
check "a POST with the token is 200 and acts: forced_open" \
  [ "$CODE/$(json 'j.name .. " " .. j.state')" = "200/twostep forced_open" ]
admin /fuse -H "$AUTH" -H "Origin: http://127.0.0.1:$ADMIN" -H 'Sec-Fetch-Site: same-origin' \
  -d 'name=twostep&action=reset'
check "a POST with the token from the endpoint's own origin is 200: closed" \
  [ "$CODE/$(json 'j.state')" = "200/closed" ]

req "$OPEN" /fuse
check "fuse.admin() without a token: GET is 200" [ "$CODE/$(json 'type(j.breakers)')" = "200/table" ]
req "$OPEN" /fuse -H "$AUTH" -d "$FORM"
check "fuse.admin() without a token: a POST is 403, even with a token" \
  [ "$CODE/$(json 'j.error:match("^POST needs a token") ~= nil')" = "403/true" ]
check "... and twostep is still closed" [ "$(state_of)" = closed ]

# ---------------------------------------------------------------- a form too large
pad=$(head -c 20000 /dev/zero | tr '\0' x)
admin /fuse -H "$AUTH" -d "name=twostep&action=force_open&pad=$pad"
check "a POST of a 20 kB form is 413 with a JSON error, not \"missing name\"" \
  [ "$CODE/$(json 'j.error:match("^the form is too large to read") ~= nil')" = "413/true" ]
diag "413: $BODY"
check "... and twostep is still closed" [ "$(state_of)" = closed ]
fields=$(for i in $(seq 150); do printf 'f%d=1&' "$i"; done)
admin /fuse -H "$AUTH" -d "${fields}name=twostep&action=force_open"
check "a POST of a form of 150 fields (more than get_post_args reads) is 413" \
  [ "$CODE/$(json 'j.error:match("^the form is too large to read %(truncated%)") ~= nil')" = "413/true" ]
check "... and twostep is still closed" [ "$(state_of)" = closed ]

# ---------------------------------------------------------------- a POST that is not a form, a typo
admin /fuse -H "$AUTH" -H 'Content-Type: application/json' -d '{"name":"twostep","action":"force_open"}'
check "a POST of a JSON body is 400 that says a form is needed, not \"missing name\"" \
  [ "$CODE/$(json 'j.error:match("^a POST.s body is a form, Content%-Type: application/x%-www%-form%-urlencoded") ~= nil')" = "400/true" ]
diag "JSON body: $BODY"
admin '/fuse?name=twostep&action=force_open' -H "$AUTH" -X POST
check "a POST with its fields in the query string is 400 that says so, not \"missing name\"" \
  [ "$CODE/$(json 'j.error:match("not in the query string$") ~= nil')" = "400/true" ]
admin /fuse -H "$AUTH" -d 'name=twostep&action=force_open&second=30'
check "a POST with a mistyped field (second=30) is 400 naming it, not a force-open until reset" \
  [ "$CODE/$(json 'j.error')" = "400/unknown field 'second' (did you mean 'seconds'?)" ]
check "... and twostep is still closed" [ "$(state_of)" = closed ]
# ---------------------------------------------------------------- a field missing, empty or twice
# (nginx gives a field given twice as a table of its values: the endpoint took the last)
admin /fuse -H "$AUTH" -d 'name=bulk-0001&name=twostep&action=force_open'
check "a POST with name=a&name=b is 400 naming the field, not an action on b alone" \
  [ "$CODE/$(json 'j.error')" = "400/field 'name' is given 2 times: give it once" ]
admin /fuse -H "$AUTH" -d 'name=twostep&action=reset&action=force_open'
check "a POST with action=reset&action=force_open is 400 naming the field, not a force-open" \
  [ "$CODE/$(json 'j.error')" = "400/field 'action' is given 2 times: give it once" ]
check "... and twostep is still closed" [ "$(state_of)" = closed ]
admin '/fuse?name=twostep&name=bulk-0001'
check "a GET of ?name=a&name=b is 400 naming the field" \
  [ "$CODE/$(json 'j.error')" = "400/field 'name' is given 2 times: give it once" ]
admin /fuse -H "$AUTH" -d 'name=twostep'
check "a POST without an action is 400 \"missing action\" (it said \"got nil\")" \
  [ "$CODE/$(json 'j.error')" = "400/missing action: action=force_open, reset or disable" ]
admin '/fuse?name='
check "GET ?name= (empty) is 400 that says so, not 404" \
  [ "$CODE/$(json 'j.error')" = "400/empty name: ?name=N asks for breaker N" ]
admin '/fuse?name'
check "GET ?name (no value) is 400 too" [ "$CODE/$(json 'j.error')" = "400/empty name: ?name=N asks for breaker N" ]
admin /fuse -H "$AUTH" -d 'name=&action=reset'
check "a POST of name= (empty) is 400 that says so" \
  [ "$CODE/$(json 'j.error')" = "400/empty name: name=N names the breaker" ]

admin '/fuse?stat=open'
check "a GET with a mistyped field (?stat=open) is 400 naming it, not every breaker" \
  [ "$CODE/$(json 'j.error')" = "400/unknown field 'stat' (did you mean 'state'?)" ]
admin /fuse -X DELETE -D "$T/headers"
check "a DELETE is 405 with Allow: GET, HEAD, POST (HEAD is answered too)" \
  [ "$CODE/$(tr -d '\r' < "$T/headers" | grep -i '^allow:')" = "405/Allow: GET, HEAD, POST" ]
admin /fuse -I
check "a HEAD is 200" [ "$CODE" = 200 ]

# ---------------------------------------------------------------- GET: one, a state, pages
admin '/fuse?name=bulk-0042'
check "GET ?name=bulk-0042 answers that breaker alone" \
  [ "$CODE/$(json 'j.name .. " " .. j.state .. " " .. tostring(j.breakers)')" = "200/bulk-0042 closed nil" ]
admin '/fuse?name=no-such-breaker'
check "GET ?name= of an unknown name is 404 with a JSON error" \
  [ "$CODE/$(json 'j.error')" = '404/no breaker named "no-such-breaker"' ]
admin '/fuse?state=opened'
check "GET ?state= of an unknown state is 400 with a JSON error" \
  [ "$CODE/$(json 'j.error:match("^state must be") ~= nil')" = "400/true" ]
admin '/fuse?limit=1001'
check "GET ?limit=1001 is 400 (at most 1000)" [ "$CODE" = 400 ]

admin /fuse
check "GET without arguments: a page of 100 breakers and a next" \
  [ "$CODE/$(json '#j.breakers .. " " .. type(j.next)')" = "200/100 string" ]

# walk PARAMS: every page of GET /fuse?PARAMS, following next; prints the names, one a
# line, and sets PAGES, BAD (pages that were not 200, valid UTF-8 and JSON), BIGGEST
walk() {
  local after="" names
  PAGES=0 BAD=0 BIGGEST=0 WHY=
  while :; do
    admin "/fuse?$1${after:+&after=$after}"
    PAGES=$((PAGES + 1))
    [ "$(wc -c < "$T/body")" -gt "$BIGGEST" ] && BIGGEST=$(wc -c < "$T/body")
    names=$(json 'table.concat((function() local t = {} for i, b in ipairs(j.breakers) do t[i] = b.name end return t end)(), "\n")')
    if [ "$CODE" != 200 ] || ! utf8_ok || [ "${names#error: }" != "$names" ]; then
      BAD=$((BAD + 1))
      WHY="page $PAGES: $CODE, $(utf8_ok && echo "valid" || echo "not valid") UTF-8, $(printf "%s" "${names:0:80}" | tr "\n" " ")"
      break
    fi
    [ -n "$names" ] && printf '%s\n' "$names"
    after=$(json 'j.next ~= require("cjson").null and j.next or ""')
    [ -z "$after" ] && break
    [ "$PAGES" -ge 100 ] && { BAD=$((BAD + 1)) WHY="more than 100 pages"; break; }
  done
}
walk 'limit=1000' > "$T/names"
total=$(wc -l < "$T/names") distinct=$(sort -u "$T/names" | wc -l)
diag "limit=1000: $PAGES pages, the largest $BIGGEST bytes"
check "pages of ?limit=1000 followed by ?after=next list every breaker once (2501)" \
  [ "$BAD/$total/$distinct/$PAGES" = "0/2501/2501/3" ]
[ -z "$WHY" ] || diag "$WHY"
check "... each page under 300 kB" [ "$BIGGEST" -lt 300000 ]

admin /fuse -H "$AUTH" -d 'name=bulk-1234&action=force_open'
admin /fuse -H "$AUTH" -d 'name=bulk-0007&action=disable'
walk 'state=forced_open&limit=1000' > "$T/names"
check "GET ?state=forced_open, every page: bulk-1234 alone" [ "$BAD/$(tr '\n' ' ' < "$T/names")" = "0/bulk-1234 " ]
[ -z "$WHY" ] || diag "$WHY"
walk 'state=disabled' > "$T/names"
check "GET ?state=disabled, every page: bulk-0007 alone" [ "$BAD/$(tr '\n' ' ' < "$T/names")" = "0/bulk-0007 " ]
[ -z "$WHY" ] || diag "$WHY"

# ---------------------------------------------------------------- a name that is not UTF-8
req "$FRONT" '/keyed?name=caf%E9'
check "a request to /keyed?name=caf%E9 makes the breaker of the 4 bytes caf\\xE9" [ "$CODE/$BODY" = "200/4" ]
admin '/fuse?name=caf%E9'
check "GET ?name=caf%E9: 200, valid UTF-8 JSON, cjson reads the name caf\\xE9 (as fuse.metrics() writes it)" \
  [ "$CODE/$(utf8_ok && echo utf8)/$(json 'j.name')" = '200/utf8/caf\xE9' ]
req "$ADMIN" /metrics
check "... fuse.metrics() writes that name the same way" grep -qF 'fuse_state{name="caf\\xE9"}' "$T/body"
walk 'limit=1000' > "$T/names"
check "every page of the listing is valid UTF-8 JSON, and lists caf\\xE9" \
  [ "$BAD/$(grep -cxF 'caf\xE9' "$T/names")" = "0/1" ]
[ -z "$WHY" ] || diag "$WHY"
admin /fuse -H "$AUTH" -d 'name=caf%E9&action=force_open'
check "a POST for name=caf%E9 acts on it and answers valid UTF-8 JSON" \
  [ "$CODE/$(utf8_ok && echo utf8)/$(json 'j.name .. " " .. j.state')" = '200/utf8/caf\xE9 forced_open' ]
admin /fuse -H "$AUTH" -d 'name=nope%E9&action=reset'
check "a POST for an unknown name nope%E9: 404, valid UTF-8 JSON" \
  [ "$CODE/$(utf8_ok && echo utf8)/$(json 'j.error')" = '404/utf8/no breaker named "nope\xE9"' ]

# ---------------------------------------------------------------- error log
log_clean "$T/logs/error.log" "no [error], [alert], [crit] or [emerg] in the nginx error log"

echo "1..$n"
[ "$failed" -eq 0 ]
