-- luacheck configuration: `make lint` checks lua, spec, bench and examples.
std = "luajit"
codes = true
exclude_files = { "build/", ".git/" }

-- busted's globals (describe, it, assert, spy, ...) in the specs
files["spec/"] = { std = "+busted" }

-- OpenResty's globals (ngx, ndk, ...) in the nginx example
files["examples/nginx/"] = { std = "ngx_lua" }
