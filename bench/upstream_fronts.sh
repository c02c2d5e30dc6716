# shellcheck shell=bash
# bench/upstream_fronts.sh -- sourced by bench/nginx_upstream_instr.sh and
# bench/nginx_upstream_share.sh: the three static peers and the three fronts both measure
# (fuse.upstream, the Lua floor, nginx's plain round robin), defined once so that the two
# benches measure the same configs. Reads S1 S2 S3 (the peers' ports), FS LS RS (the
# fronts' ports), T (the nginx prefix, for the Lua paths) and, if set, FRONT_INIT (Lua
# lines added to init_by_lua, e.g. another pool); needs test/lib/nginx.sh.

# static_peers_conf: peers.conf, one worker answering 200 on S1, S2 and S3 (keepalive)
static_peers_conf() {
  cat <<EOF
$(nginx_load_modules)
worker_processes 1;
pid logs/peers.pid;
error_log logs/peers.err crit;
events { worker_connections 1024; }
http {
    access_log off;
$(nginx_temp_paths)
    server {
        listen 127.0.0.1:$S1; listen 127.0.0.1:$S2; listen 127.0.0.1:$S3;
        keepalive_requests 1000000;
        location / { return 200 "ok\n"; }
    }
}
EOF
}

# static_front_http: the lines of http {} every front has (fuse loaded and the pool made
# in each, so that the fronts' Lua states are alike; the same proxy settings)
static_front_http() {
  cat <<EOF
    access_log off;
$(nginx_temp_paths)
$(nginx_lua_paths "$T")
    lua_shared_dict fuse_upstream 1m;
    init_by_lua_block {
        require("fuse").init{ shared = true, capacity = 64 }
        package.loaded.static = require("fuse.upstream").new("static",
            { "127.0.0.1:$S1", "127.0.0.1:$S2", "127.0.0.1:$S3" }, { fails = 3, window = 10, open_for = 5 })
        ${FRONT_INIT:-}
    }
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_next_upstream error timeout http_500 http_502 http_503 http_504;
    proxy_next_upstream_tries 2;
EOF
}

# static_front f|l|r: the upstream and server of fuse.upstream (FS), the Lua floor (LS:
# balancer_by_lua doing only set_current_peer, an empty log_by_lua) or round robin (RS)
static_front() {
  case $1 in
    f) cat <<EOF
    upstream up_static { server 0.0.0.1; balancer_by_lua_block { require("static"):balance() } keepalive 32; }
    server { listen 127.0.0.1:$FS; location / { proxy_pass http://up_static; log_by_lua_block { require("static"):log() } } }
EOF
    ;;
    l) cat <<EOF
    upstream lua_static {
        server 0.0.0.1;
        balancer_by_lua_block {
            local i = (package.loaded.lua_rr or 0) % 3 + 1
            package.loaded.lua_rr = i
            require("ngx.balancer").set_current_peer("127.0.0.1", ($S1 - 1) + i)
        }
        keepalive 32;
    }
    server { listen 127.0.0.1:$LS; location / { proxy_pass http://lua_static; log_by_lua_block { } } }
EOF
    ;;
    r) cat <<EOF
    upstream rr_static { server 127.0.0.1:$S1; server 127.0.0.1:$S2; server 127.0.0.1:$S3; keepalive 32; }
    server { listen 127.0.0.1:$RS; location / { proxy_pass http://rr_static; } }
EOF
    ;;
  esac
}

# single_front_head: front.conf of one nginx process (`master_process off`, in the
# foreground, as valgrind or a diagnostic runs it) up to the three fronts, inside an
# http {} block the caller goes on with and closes
single_front_head() {
  cat <<EOF
$(nginx_load_modules)
master_process off;
daemon off;
pid logs/front.pid;
error_log logs/front.err error;
events { worker_connections 1024; }
http {
$(static_front_http)
$(static_front f)
$(static_front l)
$(static_front r)
EOF
}

# ---- a history of failures (nginx_upstream_instr.sh and nginx_upstream_traces.sh,
# HISTORY=1): two more pools in the same front, `sick` (the static peer S1, a peer that
# answers 500 on H5, a port nobody listens on, HR; retries) and `dead` (H5 and HR only:
# every peer open), served on HS and HD. Reads H5 HR HS HD besides the above.

# history_peers_conf FILE: adds the peer answering 500 (H5) to static_peers_conf's FILE
history_peers_conf() {
  sed -i '$d' "$1"   # (the http block's closing brace, written again below)
  cat >> "$1" <<EOF
    server { listen 127.0.0.1:$H5; keepalive_requests 1000000; location / { return 500; } }
}
EOF
}

# history_init: the Lua lines of FRONT_INIT that make the pools sick and dead
history_init() {
  cat <<EOF
package.loaded.sick = require("fuse.upstream").new("sick", { "127.0.0.1:$S1", "127.0.0.1:$H5", "127.0.0.1:$HR" },
            { fails = 3, window = 10, open_for = 5, probes = 1, probe_timeout = 5, tries = 2 })
        package.loaded.dead = require("fuse.upstream").new("dead", { "127.0.0.1:$H5", "127.0.0.1:$HR" },
            { fails = 3, window = 10, open_for = 1, probes = 1, probe_timeout = 5, tries = 2 })
EOF
}

# history_front: the upstreams and servers of the pools sick (HS) and dead (HD)
history_front() {
  cat <<EOF
    upstream up_sick { server 0.0.0.1; balancer_by_lua_block { require("sick"):balance() } keepalive 32; }
    server { listen 127.0.0.1:$HS; location / { proxy_pass http://up_sick; log_by_lua_block { require("sick"):log() } } }
    upstream up_dead { server 0.0.0.1; balancer_by_lua_block { require("dead"):balance() } keepalive 32; }
    server { listen 127.0.0.1:$HD; location / { proxy_pass http://up_dead; log_by_lua_block { require("dead"):log() } } }
EOF
}

# run_history SECONDS OUT: the history itself, `wrk -t1 -c3` on sick and `wrk -t1 -c2` on
# dead at once for SECONDS; their wrk outputs in OUT.sick and OUT.dead
run_history() {
  wrk -t1 -c2 -d"$1s" "http://127.0.0.1:$HD/" > "$2.dead" 2>&1 &
  wrk -t1 -c3 -d"$1s" "http://127.0.0.1:$HS/" > "$2.sick" 2>&1
  wait $!
}
