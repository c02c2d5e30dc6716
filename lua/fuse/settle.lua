-- fuse.settle: OpenResty's log phase, for calls that end the request; the facade
-- (lua/fuse.lua) gives fuse.settle and fuse.log from here. The calls in flight are noted
-- by fuse.pending.
local pending = require "fuse.pending"

local rawget, tonumber = rawget, tonumber

local TRACK = pending.enabled

local _M = {}

-- fuse.settle(): in nginx's log phase (`log_by_lua_block { require("fuse").settle() }`),
-- settles the guarded calls of this request whose function ended the request (ngx.exit,
-- ngx.exec, ngx.redirect) and so never returned to the guard: counted by the response
-- status (500 and above a failure, 499 ignored, anything else a success), their permits
-- given back. Does nothing elsewhere, or when every call returned. See fuse.pending.
function _M.settle()
  if TRACK then
    local ngx = rawget(_G, "ngx")
    pending.settle_request(tonumber(ngx.status) or 0)
  end
end

-- fuse.log(): the old name of fuse.settle() (it logs nothing). Works as before, and says
-- once per process (an nginx worker) that it is deprecated.
local said_log = false
function _M.log()
  if not said_log then
    said_log = true
    local msg = "fuse: fuse.log() is deprecated: call fuse.settle(), which does the same "
      .. "(log_by_lua_block { require(\"fuse\").settle() })"
    local ngx = rawget(_G, "ngx")
    if ngx and ngx.log then ngx.log(ngx.WARN, msg) else io.stderr:write(msg, "\n") end
  end
  return _M.settle()
end

return _M
