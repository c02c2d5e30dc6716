-- fuse.upstream's nginx phases without nginx, for the specs (LuaJIT only): a copy of the
-- module loaded while `ngx`, ngx.balancer and resty.core.base are stand-ins, so that it
-- takes the nginx paths (NGX true) and pool:balance() and pool:log() run as in
-- balancer_by_lua* and log_by_lua*. The C functions behind lua-resty-core's (ffi.C's
-- ngx_http_lua_ffi_*) are not declared here, so the module calls the public functions
-- throughout, which read the request's state from `req` below.
--
--   local nginx = require("spec.fake_nginx").new()
--   local pool = nginx.upstream.new("p", { "10.0.0.1:1", "10.0.0.1:2" })
--   nginx.req.failure, nginx.req.code = "failed", 502      -- nginx retries after a 502
--   nginx.var.upstream_status = "502, 200"                 -- what the log phase reads
--   pool:balance(); pool:log()
local ffi = require "ffi"

local M = {}

-- A lua_shared_dict's methods (those fuse.upstream uses), over a table: the stand-in
-- fuse.upstream itself uses outside nginx.
local dict = require("fuse.upstream")._local_store

-- A fake nginx and a copy of fuse.upstream loaded under it. `req` is the request being
-- served: its start time, whether it is internal, nginx's state of the previous try
-- (failure, code) and its $upstream_* variables (var); `peers` the peers nginx was set.
function M.new()
  local req = { start = 1, internal = false, failure = nil, code = nil }
  local var = {}
  local R = ffi.cast("void *", 0x7f0000012340)  -- the request's address (16-aligned)
  local set = {}
  local ngx = {
    shared = setmetatable({}, { __index = function(s, name) local d = dict(); s[name] = d; return d end }),
    req = { start_time = function() return req.start end,
            is_internal = function() return req.internal end },
    var = var, header = {}, status = 200,
    now = function() return req.start end, update_time = function() end,
    log = function() end, WARN = 5, ERR = 4, ERROR = -1,
    exit = function(code) error("ngx.exit(" .. tostring(code) .. ")", 2) end,
  }
  local balancer = {
    get_last_failure = function() return req.failure, req.code end,
    set_current_peer = function(host, port) set[#set + 1] = host .. ":" .. port; return true end,
    set_more_tries = function() return true end,
  }
  local base = { get_request = function() return R end }
  local saved = { ngx = rawget(_G, "ngx"), balancer = package.loaded["ngx.balancer"],
    base = package.loaded["resty.core.base"], upstream = package.loaded["fuse.upstream"] }
  rawset(_G, "ngx", ngx)
  package.loaded["ngx.balancer"], package.loaded["resty.core.base"] = balancer, base
  package.loaded["fuse.upstream"] = nil
  local ok, upstream = pcall(require, "fuse.upstream")
  package.loaded["fuse.upstream"] = saved.upstream
  package.loaded["ngx.balancer"], package.loaded["resty.core.base"] = saved.balancer, saved.base
  rawset(_G, "ngx", saved.ngx)
  assert(ok, upstream)
  local self = { upstream = {}, module = upstream, req = req, var = var, ngx = ngx, set = set }
  -- upstream.new finds the shared dict in ngx.shared (as under nginx)
  function self.upstream.new(...)
    rawset(_G, "ngx", ngx)
    local pok, pool = pcall(upstream.new, ...)
    rawset(_G, "ngx", saved.ngx)
    if not pok then error(pool, 2) end
    return pool
  end
  return self
end

return M
