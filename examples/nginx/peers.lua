-- examples/nginx/peers.lua: three fake peers whose behaviour a test or a demo switches at
-- run time (examples/nginx/peers.conf serves them). State lives in the lua_shared_dict
-- `peers`, so every worker answers alike. Per peer (its listening port):
--   mode  ok (200) | fail (500) | status (answers `status`) | hang (sleeps `delay` s, then 200)
--         | slowfail (sleeps `delay` s, then 500) | refuse (closes the connection unanswered:
--         the front sees a reset, a connect-class failure)
--   hits  requests that reached it; `max` the most it ever served at once; the first
--         ARRIVALS requests' arrival and end ("+" or "-", time, the front's port), for a
--         test's diagnostics.
--   checks  requests for /health (fuse.upstream's option `check`), apart from hits
local ngx = ngx
local d = ngx.shared.peers

local _M = {}

local LEVELS = 256  -- concurrency levels a reset clears (far above any test's)
local ARRIVALS = 512

local function note(port, what)
  local k = "arrivals:" .. port
  if (d:llen(k) or 0) < 2 * ARRIVALS then
    d:rpush(k, ("%s%.3f %s"):format(what, ngx.now(), ngx.var.remote_port or "-"))
  end
end
local MODES = { ok = true, fail = true, status = true, hang = true, slowfail = true, refuse = true }

-- A request for /health is a check of fuse.upstream's option `check`: counted in
-- `checks`, apart from hits and the concurrency levels, and answered as any request.
function _M.serve()
  local port = ngx.var.server_port
  local mode = d:get("mode:" .. port) or "ok"
  local check = ngx.var.uri == "/health"
  if check then
    d:incr("checks:" .. port, 1, 0)
  else
    d:incr("hits:" .. port, 1, 0)
    local now = d:incr("now:" .. port, 1, 0)
    d:set("reached:" .. port .. ":" .. now, true)      -- concurrency levels seen
  end
  note(port, "+")
  if mode == "hang" or mode == "slowfail" then ngx.sleep(d:get("delay:" .. port) or 1) end
  if not check then d:incr("now:" .. port, -1, 0) end
  note(port, "-")
  if mode == "refuse" then return ngx.exit(444) end
  ngx.header["X-Peer"] = port
  if mode == "fail" or mode == "slowfail" then
    ngx.status = 500
  elseif mode == "status" then
    ngx.status = d:get("status:" .. port) or 200
  end
  ngx.say("peer ", port, " ", mode)
end

local function max_reached(port)
  local m = 0
  while d:get("reached:" .. port .. ":" .. (m + 1)) do m = m + 1 end
  return m
end

-- /control?port=P&mode=M[&delay=S][&status=N][&reset=1]  (reset: hits and max of P to 0)
-- /control?port=P  prints "hits=N max=N mode=M now=N checks=N" (now: requests it is serving)
-- /control?port=P&arrivals=1  prints the arrivals and ends noted since the last reset
function _M.control()
  local a = ngx.req.get_uri_args()
  local port = a.port
  if not port then ngx.status = 400; return ngx.say("port=P needed") end
  if a.reset then
    d:set("hits:" .. port, 0)
    d:set("checks:" .. port, 0)
    -- every level, gaps included: a reset while requests are in flight deletes the
    -- levels below theirs, and a level they set afterwards (above the gap) would
    -- otherwise stay and count again once the levels below it are reached anew
    for i = 1, LEVELS do d:delete("reached:" .. port .. ":" .. i) end
    d:delete("arrivals:" .. port)
  end
  if a.arrivals then
    local k = "arrivals:" .. port
    local out = {}
    for i = 1, d:llen(k) or 0 do out[i] = d:lpop(k) end
    for i = 1, #out do d:rpush(k, out[i]) end
    return ngx.say(table.concat(out, " "))
  end
  if a.mode then
    if not MODES[a.mode] then ngx.status = 400; return ngx.say("unknown mode") end
    d:set("mode:" .. port, a.mode)
    d:set("delay:" .. port, tonumber(a.delay) or 1)
    d:set("status:" .. port, tonumber(a.status) or 200)
  end
  ngx.say(("hits=%d max=%d mode=%s now=%d checks=%d"):format(d:get("hits:" .. port) or 0, max_reached(port),
    d:get("mode:" .. port) or "ok", d:get("now:" .. port) or 0, d:get("checks:" .. port) or 0))
end

return _M
