-- fuse.admin: OpenResty helpers for operating breakers, over fuse's public API only.
-- Re-exported by fuse as fuse.admin(), fuse.reject(rej [, status]) and
-- fuse.watch(fn [, interval]).
--
--   fuse.admin()   content_by_lua: GET lists every named breaker as JSON; POST
--                  name=N&action=force_open|reset|disable[&seconds=S] acts on one
--   fuse.reject()  answers a rejection: 503 (or status), Retry-After, its text
--   fuse.watch()   init_worker_by_lua: fn(name, from, to) for every transition any
--                  worker made, polled from fuse.events
local fuse = require "fuse"

local ceil, floor, max = math.ceil, math.floor, math.max
local ipairs, pcall, tostring, type = ipairs, pcall, tostring, type

local _M = {}

local MAX_SECONDS = 2764800  -- as b:force_open(seconds)

local function ngx_api(what)
  local ngx = rawget(_G, "ngx")
  if not (ngx and ngx.req and ngx.timer) then
    error("fuse: " .. what .. " needs OpenResty (the nginx Lua module)", 3)
  end
  return ngx
end

---------------------------------------------------------------------------- admin

local cjson  -- cjson.safe, loaded on first use (OpenResty bundles it; Debian: lua-cjson)

-- One breaker as the admin endpoint shows it: its stats, named.
function _M.breaker_json(b)
  local s = b:stats()
  return {
    name = b.name, state = s.state, retry_after = s.retry_after,
    calls = s.calls, failures = s.failures, slow = s.slow, rejections = s.rejections,
    failure_rate = s.failure_rate, slow_rate = s.slow_rate,
    calls_total = s.calls_total, successes_total = s.successes_total,
    failures_total = s.failures_total, slow_total = s.slow_total,
    rejections_total = s.rejections_total, opens_total = s.opens_total,
    running = s.running, full_total = s.full_total,
  }
end

local ACTIONS = { force_open = true, reset = true, disable = true }

-- A form value: the last one when the field is repeated (ngx gives a table then).
local function value(v)
  if type(v) == "table" then v = v[#v] end
  if v == true then return "" end  -- a bare key ("name" without "=")
  return v
end

-- Decimal seconds only ("30", "2.5", ".5"): no hex, exponents, inf or nan.
local function parse_seconds(s)
  if type(s) ~= "string" or not (s:match("^%d+%.?%d*$") or s:match("^%.%d+$")) then return nil end
  local n = tonumber(s)
  if n and n > 0 and n <= MAX_SECONDS then return n end
end

-- The admin request as data: method ("GET", "POST", ...) and, for POST, the form
-- fields. Returns the HTTP status and the table to answer as JSON. No I/O: busted
-- tests call it directly.
function _M.handle(method, args)
  if method == "GET" or method == "HEAD" then
    local list = {}
    for _, name in ipairs(fuse.list()) do
      local b = fuse.get(name)
      if b then list[#list + 1] = _M.breaker_json(b) end
    end
    return 200, { breakers = list }
  elseif method ~= "POST" then
    return 405, { error = "method " .. tostring(method) .. " not allowed: GET or POST" }
  end
  args = args or {}
  local name, action, seconds = value(args.name), value(args.action), value(args.seconds)
  if type(name) ~= "string" or name == "" then
    return 400, { error = "missing name" }
  elseif not ACTIONS[action] then
    return 400, { error = "action must be force_open, reset or disable, got " .. tostring(action) }
  end
  local secs
  if seconds ~= nil then
    if action ~= "force_open" then return 400, { error = "seconds applies to force_open only" } end
    secs = parse_seconds(seconds)
    if not secs then
      return 400, { error = "seconds must be a number in (0, " .. MAX_SECONDS .. "], got " .. tostring(seconds) }
    end
  end
  local b = fuse.get(name)
  if not b then return 404, { error = "no breaker named " .. name } end
  if action == "force_open" then b:force_open(secs) elseif action == "reset" then b:reset() else b:disable() end
  return 200, _M.breaker_json(b)
end

-- JSON of an answer. The list of breakers is joined by hand, so that an empty one is
-- still a JSON array with any lua-cjson (2.1.0 has no empty_array).
function _M.encode(body)
  cjson = cjson or require "cjson.safe"
  if not body.breakers then return cjson.encode(body) end
  local items = {}
  for i, b in ipairs(body.breakers) do items[i] = cjson.encode(b) end
  return '{"breakers":[' .. table.concat(items, ",") .. "]}"
end

-- fuse.admin(): a content_by_lua* handler. Access control is nginx's: put it on a
-- listener of its own with allow/deny.
function _M.admin()
  local ngx = ngx_api("fuse.admin")
  local method, args = ngx.req.get_method(), nil
  if method == "POST" then
    ngx.req.read_body()
    args = ngx.req.get_post_args()
  end
  local status, body = _M.handle(method, args)
  ngx.status = status
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Cache-Control"] = "no-store"
  if status == 405 then ngx.header["Allow"] = "GET, POST" end
  ngx.say(_M.encode(body))
  return ngx.exit(status)
end

---------------------------------------------------------------------------- reject

-- Retry-After in whole seconds for a rejection: rounded up, at least 1.
function _M.retry_after(rej)
  return max(1, ceil(rej.retry_after))
end

-- fuse.reject(rej [, status]): answers the rejection and ends the request.
function _M.reject(rej, status)
  if not fuse.is_rejection(rej) then
    error("fuse: fuse.reject needs a rejection, got " .. tostring(rej), 2)
  end
  if status ~= nil and (type(status) ~= "number" or status ~= floor(status) or status < 400 or status > 599) then
    error("fuse: fuse.reject's status must be an HTTP status from 400 to 599, got " .. tostring(status), 2)
  end
  local ngx = ngx_api("fuse.reject")
  status = status or 503
  ngx.status = status
  ngx.header["Retry-After"] = _M.retry_after(rej)
  ngx.header["Content-Type"] = "text/plain"
  ngx.say(tostring(rej))
  return ngx.exit(status)
end

---------------------------------------------------------------------------- watch

-- A poll step for fn: each call delivers, in order, the transitions recorded since the
-- previous one, as fn(name, from, to, event). Transitions the ring lost in between (an
-- overrun: more than its 1024 entries between two polls) are reported first, as one
-- call fn(nil, "overrun", n). An error in fn is reported through fuse.report_error and
-- never stops the watch. It starts from the newest event at the time it is made.
function _M.poller(fn)
  local _, _, since = fuse.events()
  local function call(...)
    local ok, err = pcall(fn, ...)
    if not ok then fuse.report_error("fuse: a fuse.watch callback failed: " .. tostring(err)) end
  end
  return function()
    local list, lost, upto = fuse.events(since)
    since = upto
    if lost > 0 then call(nil, "overrun", lost) end
    for _, e in ipairs(list) do call(e.name, e.from, e.to, e) end
    return #list, lost
  end
end

-- fuse.watch(fn [, interval]): in init_worker_by_lua*, fn(name, from, to) in this
-- worker for every transition any worker makes, polled every `interval` seconds (0.5).
function _M.watch(fn, interval)
  if type(fn) ~= "function" then error("fuse: fuse.watch needs a function, got " .. type(fn), 2) end
  if interval ~= nil and (type(interval) ~= "number" or not (interval >= 0.001 and interval <= 3600)) then
    error("fuse: fuse.watch's interval must be seconds from 0.001 to 3600, got " .. tostring(interval), 2)
  end
  local ngx = ngx_api("fuse.watch")
  local poll = _M.poller(fn)
  return ngx.timer.every(interval or 0.5, function(premature)
    if not premature then poll() end
  end)
end

return _M
