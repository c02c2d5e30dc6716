#!/usr/bin/env bash
# bench/nginx_upstream_instr.sh [LUA_DIR] -- instructions per request (user space:
# nginx, LuaJIT, its traces, the Lua module, fuse's core) of one nginx front under
# callgrind, for the three fronts of bench/nginx_upstream.sh part 3: fuse.upstream, the
# Lua floor (balancer_by_lua doing only set_current_peer, an empty log_by_lua) and
# nginx's plain round robin, over three static peers (return 200, keepalive).
#
# The front runs with `master_process off` (one process, the worker itself) under
# `valgrind --tool=callgrind --instr-atstart=no`; the peers run in a second nginx, not
# counted. Per front: 4 s of `wrk -t1 -c4` uninstrumented (the traces are compiled),
# then the counters zeroed, instrumentation on, 6 s of `wrk -t1 -c4`, instrumentation
# off, a dump; the dump's total over the requests wrk counted, the fronts in rotating
# order (each first in one round of three). ROUNDS (3) fresh nginx
# starts, each printed, then the medians. LUA_DIR (default: this tree's lua/) is the
# fuse.upstream to measure, so that two trees can be compared on one machine.
#
# GC: LuaJIT's collector is stopped for each measured window (a full collection first),
# and the bytes the window's Lua allocated are printed per request. The collector's work
# follows the bytes allocated, but a window of 6 s holds a part of its cycle that changes
# from window to window (its mark and sweep steps moved a front by 200 to 600
# instructions a request either way); with the same bytes a request, two fronts pay the
# same for it in the long run, so the windows leave it out and the bytes say whether
# they do.
# HISTORY=1: before the fronts of each round, the same front process is driven through
# failures, as parts 1 and 2 of bench/nginx_upstream.sh drive theirs: HISTORY_S (20) s of
# `wrk -t1 -c3` on a fourth fuse.upstream pool, `sick`, whose three peers are a static
# peer, one that answers 500 and a port nobody listens on (fails = 3, open_for = 5,
# probes = 1, tries = 2, proxy_next_upstream on error and http_500, tries 2): retries,
# open peers, probes; and at the same time `wrk -t1 -c2` on a fifth, `dead`, of the 500
# peer and the refused port only (open_for = 1): every peer open, failed probes, 502s
# and 503s. The request counts are printed. Then the rounds as above, so that the
# static pool's cost after history can be set against a run without (HISTORY=0).
# About 40 s a round (HISTORY_S more with HISTORY=1).
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/lib/nginx.sh
. "$ROOT/test/lib/nginx.sh"
# shellcheck source=bench/upstream_fronts.sh
. "$ROOT/bench/upstream_fronts.sh"
NGINX=$(nginx_bin)
LUA=${1:-$ROOT/lua}
ROUNDS=${ROUNDS:-3}
HISTORY=${HISTORY:-0}
HISTORY_S=${HISTORY_S:-20}
die() { echo "bench-upstream-instr: $*" >&2; exit 1; }
[ -x "$NGINX" ] || die "nginx is not installed"
for c in valgrind callgrind_control callgrind_annotate wrk curl bc; do
  command -v "$c" >/dev/null || die "$c is not installed"
done
[ -r "$ROOT/build/fuse/core.so" ] || die "build/fuse/core.so is missing: run make first"
[ -r "$LUA/fuse/upstream.lua" ] || die "no fuse/upstream.lua under $LUA"

T=$(mktemp -d /tmp/fuse-bench-instr.XXXXXX) || die "mktemp failed"
PIDS=()
VP=
stop_front() { [ -n "$VP" ] && stop_pid "$VP" TERM; wait "$VP" 2>/dev/null; VP=; }
trap 'stop_front; cleanup_nginx "${PIDS[@]}"' EXIT
trap 'exit 1' INT TERM HUP
copy_fuse "$T" "$LUA"
mkdir -p "$T/logs" "$T/temp"
BASE=$(pick_ports 12) || die "no 12 free ports in a row"
S1=$((BASE + 1)) S2=$((BASE + 2)) S3=$((BASE + 3)) FS=$((BASE + 4)) LS=$((BASE + 5)) RS=$((BASE + 6))
GS=$((BASE + 7))
H5=$((BASE + 8)) HR=$((BASE + 9)) HS=$((BASE + 10)) HD=$((BASE + 11))   # history: the 500 peer, the refused port, the fronts
static_peers_conf > "$T/peers.conf"
history="" FRONT_INIT=""
if [ "$HISTORY" = 1 ]; then
  history_peers_conf "$T/peers.conf"
  FRONT_INIT=$(history_init) history=$(history_front)
fi
cat > "$T/front.conf" <<EOF
$(single_front_head)
$history
    server {  # the collector, for the measured windows (see GC above)
        listen 127.0.0.1:$GS;
        location = /stop { content_by_lua_block { collectgarbage("collect"); collectgarbage("stop"); ngx.say(collectgarbage("count")) } }
        location = /count { content_by_lua_block { ngx.say(collectgarbage("count")) } }
        location = /restart { content_by_lua_block { collectgarbage("restart") } }
    }
}
EOF
chmod -R a+rX "$T"
"$NGINX" -p "$T/" -c peers.conf || die "the peers did not start"
PIDS+=("$(cat "$T/logs/peers.pid")")

median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo "bench-upstream-instr: $(date -u +%Y-%m-%dT%H:%MZ), nginx $("$NGINX" -v 2>&1 | cut -d/ -f2), fuse.upstream from $LUA"
f_all="" l_all="" r_all=""
for round in $(seq "$ROUNDS"); do
  valgrind --tool=callgrind --instr-atstart=no --smc-check=all-non-file \
    --callgrind-out-file="$T/cg.out" "$NGINX" -p "$T/" -c front.conf > "$T/valgrind.log" 2>&1 &
  VP=$!
  wait_for 60 curl -s -m 1 -o /dev/null "http://127.0.0.1:$FS/" || die "the front does not answer (see $T/valgrind.log)"
  line="   round $round:"
  if [ "$HISTORY" = 1 ]; then
    run_history "$HISTORY_S" "$T/history"
    line="$line history sick $(awk '/requests in/ { print $1 }' "$T/history.sick") requests ($(awk '/Non-2xx/ { n = $NF } END { print n + 0 }' "$T/history.sick") non-2xx),"
    line="$line dead $(awk '/requests in/ { print $1 }' "$T/history.dead") ($(awk '/Non-2xx/ { n = $NF } END { print n + 0 }' "$T/history.dead") non-2xx);"
  fi
  # the fronts in rotating order (f l r, l r f, r f l, ...): the first measured after a
  # start pays more for the same allocations (about 100 to 230 instructions a request
  # in fz-up4's runs), so each front takes its turn first
  sides=(f l r)
  k=$(( (round - 1) % 3 ))
  for side in "${sides[@]:k}" "${sides[@]:0:k}"; do
    case $side in f) port=$FS name=fuse.upstream ;; l) port=$LS name="Lua floor" ;; r) port=$RS name="round robin" ;; esac
    wrk -t1 -c4 -d4s "http://127.0.0.1:$port/" > /dev/null 2>&1
    kb0=$(curl -s -m 30 "http://127.0.0.1:$GS/stop")
    callgrind_control -z "$VP" > /dev/null
    callgrind_control -i on "$VP" > /dev/null
    out=$(wrk -t1 -c4 -d6s "http://127.0.0.1:$port/" 2>&1)
    callgrind_control -i off "$VP" > /dev/null
    kb1=$(curl -s -m 30 "http://127.0.0.1:$GS/count")
    curl -s -m 30 -o /dev/null "http://127.0.0.1:$GS/restart"
    rm -f "$T"/cg.out*
    callgrind_control -d "$side" "$VP" > /dev/null
    wait_for 10 sh -c "ls '$T'/cg.out* > /dev/null 2>&1"
    sleep 0.5
    n=$(awk '/requests in/ { print $1 }' <<< "$out")
    ir=$(callgrind_annotate "$(ls "$T"/cg.out* | head -1)" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
    per=$(echo "$ir / $n" | bc)
    bytes=$(echo "($kb1 - $kb0) * 1024 / $n" | bc)
    line="$line $name $per ($bytes B);"
    case $side in f) f_all="$f_all $per" ;; l) l_all="$l_all $per" ;; r) r_all="$r_all $per" ;; esac
  done
  stop_front
  echo "$line instructions (Lua bytes allocated) per request"
done
fm=$(echo "$f_all" | median) lm=$(echo "$l_all" | median) rm=$(echo "$r_all" | median)
printf '   medians: fuse.upstream %.0f, Lua floor %.0f, round robin %.0f; fuse.upstream - floor %+.0f, floor - round robin %+.0f\n' \
  "$fm" "$lm" "$rm" "$(echo "$fm - $lm" | bc)" "$(echo "$lm - $rm" | bc)"
