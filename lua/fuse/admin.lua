-- fuse.admin: OpenResty helpers for operating breakers, over fuse's public API (and
-- fuse._page, its walk over the registry). Re-exported by fuse as fuse.admin([opts]),
-- fuse.reject(rej [, status]) and fuse.watch(fn [, interval]).
--
--   fuse.admin{ token = T }  content_by_lua: GET lists the named breakers as JSON, a page
--                  at a time (?limit=, ?after=), one (?name=) or those in a state
--                  (?state=); POST name=N&action=force_open|reset|disable[&seconds=S]
--                  acts on one, when it carries "Authorization: Bearer T" and no mark
--                  of a browser's cross-site request
--   fuse.reject()  answers a rejection: 503 (or status), Retry-After, its text
--   fuse.watch()   init_worker_by_lua: fn(name, from, to) for every transition any
--                  worker made, polled from fuse.events
local fuse = require "fuse"
local options = require "fuse.options"

local ceil, floor, max = math.ceil, math.floor, math.max
local ipairs, pairs, pcall, tonumber, tostring, type = ipairs, pairs, pcall, tonumber, tostring, type
local concat = table.concat
local co_running, co_status = coroutine.running, coroutine.status
local show = options.show  -- how every message of fuse's shows a value

local _M = {}

local MAX_SECONDS = 2764800  -- as b:force_open(seconds)
local LIMIT, MAX_LIMIT = 100, 1000  -- breakers per GET page, by default and at most: 1000
                                    -- are ~240 kB with short names, < 1 MB with any
local BUDGET = 5000  -- registry slots one GET page looks at, at most (so that ?state= over
                     -- 100,000 breakers takes 20 pages of a few tens of ms each, not one of seconds)

local function ngx_api(what)
  local ngx = rawget(_G, "ngx")
  if not (ngx and ngx.req and ngx.timer) then
    error("fuse: " .. what .. " needs OpenResty (the nginx Lua module)", 3)
  end
  return ngx
end

---------------------------------------------------------------------------- admin

local cjson  -- cjson.safe, loaded on first use (OpenResty bundles it; Debian: lua-cjson)

-- One breaker as the admin endpoint shows it: its stats, named. The name as the
-- metrics' label writes it (options.utf8_text), so that the JSON is UTF-8 for any name.
function _M.breaker_json(b)
  local s = b:stats()
  return {
    name = options.utf8_text(b.name), state = s.state, retry_after = s.retry_after,
    calls = s.calls, failures = s.failures, slow = s.slow, rejections = s.rejections,
    failure_rate = s.failure_rate, slow_rate = s.slow_rate,
    calls_total = s.calls_total, successes_total = s.successes_total,
    failures_total = s.failures_total, slow_total = s.slow_total,
    rejections_total = s.rejections_total, opens_total = s.opens_total,
    running = s.running, full_total = s.full_total,
  }
end

local ACTIONS = { force_open = true, reset = true, disable = true }
local STATES = { closed = true, open = true, half_open = true, forced_open = true, disabled = true }

-- A form or query value (a repeated field, which ngx gives as a table, is refused
-- before: see repeated_field).
local function value(v)
  if v == true then return "" end  -- a bare key ("name" without "=")
  return v
end

-- Decimal seconds only ("30", "2.5", ".5"): no hex, exponents, inf or nan.
local function parse_seconds(s)
  if type(s) ~= "string" or not (s:match("^%d+%.?%d*$") or s:match("^%.%d+$")) then return nil end
  local n = tonumber(s)
  if n and n > 0 and n <= MAX_SECONDS then return n end
end

-- A whole decimal number from lo to hi ("25"), or nil.
local function parse_int(s, lo, hi)
  if type(s) ~= "string" or not s:match("^%d+$") or #s > 10 then return nil end
  local n = tonumber(s)
  if n >= lo and n <= hi then return n end
end

local function bad(what, v) return 400, { error = what .. ", got " .. show(v) } end

local function get(args)
  local name, state = value(args.name), value(args.state)
  local limit, after = value(args.limit), value(args.after)
  if name ~= nil then
    if state ~= nil or limit ~= nil or after ~= nil then
      return 400, { error = "name asks for one breaker: it takes no state, limit or after" }
    end
    if name == "" then return 400, { error = "empty name: ?name=N asks for breaker N" } end
    local b = fuse.get(name)
    if not b then return 404, { error = "no breaker named " .. show(name) } end
    return 200, _M.breaker_json(b)
  end
  if state ~= nil and not STATES[state] then
    return bad("state must be closed, open, half_open, forced_open or disabled", state)
  end
  local n = LIMIT
  if limit ~= nil then
    n = parse_int(limit, 1, MAX_LIMIT)
    if not n then return bad("limit must be a whole number from 1 to " .. MAX_LIMIT, limit) end
  end
  local from = 0
  if after ~= nil then
    from = parse_int(after, 0, 2^31)
    if not from then return bad("after must be the next of an earlier page", after) end
  end
  local list, nxt = fuse._page(from, n, BUDGET, function(breaker_name)
    local b = fuse.get(breaker_name)
    if not b or (state ~= nil and b:state() ~= state) then return nil end  -- (cheaper than stats)
    local j = _M.breaker_json(b)
    if state == nil or j.state == state then return j end
  end)
  return 200, { breakers = list, next = nxt and tostring(nxt) }
end

local function post(args)
  local name, action, seconds = value(args.name), value(args.action), value(args.seconds)
  if name == nil then
    return 400, { error = "missing name" }
  elseif name == "" then
    return 400, { error = "empty name: name=N names the breaker" }
  elseif action == nil then
    return 400, { error = "missing action: action=force_open, reset or disable" }
  elseif not ACTIONS[action] then
    return bad("action must be force_open, reset or disable", action)
  end
  local secs
  if seconds ~= nil then
    if action ~= "force_open" then return 400, { error = "seconds applies to force_open only" } end
    secs = parse_seconds(seconds)
    if not secs then
      return bad("seconds must be decimal digits (30, 2.5) for a number in (0, " .. MAX_SECONDS .. "]", seconds)
    end
  end
  local b = fuse.get(name)
  if not b then return 404, { error = "no breaker named " .. show(name) } end
  if action == "force_open" then b:force_open(secs) elseif action == "reset" then b:reset() else b:disable() end
  return 200, _M.breaker_json(b)
end

-- The fields each method takes. Any other is a 400, not ignored: a mistyped one would
-- change what was asked (a POST of force_open with "second=30" forced the circuit open
-- until a reset, not for 30 s; a GET of "stat=open" listed every breaker).
local FIELDS = { GET = { "name", "state", "limit", "after" }, POST = { "name", "action", "seconds" } }
local FIELD_SET = {}
for m, list in pairs(FIELDS) do
  FIELD_SET[m] = {}
  for _, f in ipairs(list) do FIELD_SET[m][f] = true end
end

-- The 400 for the first field (in sorted order) of args that method does not take, or nil.
local function unknown_field(method, args)
  local unknown = {}
  for k in pairs(args) do
    if not FIELD_SET[method][k] then unknown[#unknown + 1] = tostring(k) end
  end
  if #unknown == 0 then return nil end
  table.sort(unknown)
  local k = unknown[1]
  local near = options.suggest(k, FIELDS[method])
  local hint = near and "did you mean '" .. near .. "'?" or "a " .. method .. " takes " .. concat(FIELDS[method], ", ")
  if method == "GET" and FIELD_SET.POST[k] then
    hint = hint .. "; an action is a POST of name=N&action=A[&seconds=S]"
  end
  return 400, { error = "unknown field " .. options.quote(k, "'") .. " (" .. hint .. ")" }
end

-- The 400 for the first field (in sorted order) given more than once, or nil. ngx gives
-- a repeated field as a table of its values: taking one of them would act on what the
-- sender may not have meant (name=a&name=b, action=reset&action=force_open).
local function repeated_field(args)
  local rep = {}
  for k, v in pairs(args) do
    if type(v) == "table" then rep[#rep + 1] = tostring(k) end
  end
  if #rep == 0 then return nil end
  table.sort(rep)
  local k = rep[1]
  return 400, { error = "field " .. options.quote(k, "'") .. " is given " .. #args[k] .. " times: give it once" }
end

-- The admin request as data: method ("GET", "POST", ...) and its arguments (for GET
-- the query's, for POST the form's). Returns the HTTP status and the table to answer
-- as JSON. No I/O and no access control (see _M.refused): busted tests call it
-- directly.
--   GET                  a page of breakers: { breakers = { ... }, next = cursor or nil }
--     ?limit=N           N a page (1 to 1000; 100)
--     ?after=C           the page that starts where the one whose `next` was C ended
--     ?state=S           only the breakers in state S (a page may then hold fewer than
--                        limit, even none, and still have a next)
--     ?name=N            that breaker alone (404 when there is none)
--   POST name=N&action=force_open|reset|disable[&seconds=S]
function _M.handle(method, args)
  args = args or {}
  local m = method == "HEAD" and "GET" or method
  if not FIELDS[m] then return 405, { error = "method " .. show(method) .. " not allowed: GET, HEAD or POST" } end
  local status, body = unknown_field(m, args)
  if status then return status, body end
  status, body = repeated_field(args)
  if status then return status, body end
  if m == "GET" then return get(args) end
  return post(args)
end

-- host[:port] without the default port of the scheme, in lower case.
local function authority(s, scheme)
  s = s:lower()
  local default = scheme == "https" and ":443" or ":80"
  if s:sub(-#default) == default then s = s:sub(1, -#default - 1) end
  return s
end

-- The reason to refuse a POST, or nil. headers: the request's, with lower-case names
-- (ngx.req.get_headers()); token: the one fuse.admin was given, or nil. A browser marks
-- the requests that a page makes (a plain <form method=post> on any site) with
-- Sec-Fetch-Site and Origin; a page never sets Authorization on another site's request
-- without that site's consent (CORS). Neither mark is refused when absent: curl and
-- other clients send neither.
function _M.refused(headers, token)
  local site = headers["sec-fetch-site"]
  if site ~= nil and site ~= "same-origin" and site ~= "none" then
    return "a browser's request from another site (Sec-Fetch-Site: " .. show(site) .. ")"
  end
  local origin = headers["origin"]
  if origin ~= nil then
    local host = headers["host"]
    local scheme, auth = nil, nil
    if type(origin) == "string" then scheme, auth = origin:match("^(%a[%w+.-]*)://([^/]+)$") end
    if not (auth and type(host) == "string" and authority(auth, scheme:lower()) == authority(host, scheme:lower())) then
      return "a browser's request from another site (Origin " .. show(origin) .. ", this endpoint is "
        .. show(host) .. ")"
    end
  end
  if not token then
    return 'POST needs a token: fuse.admin{ token = "..." }, sent as "Authorization: Bearer <token>"'
  end
  local auth = headers["authorization"]
  local given = type(auth) == "string" and auth:match("^[Bb][Ee][Aa][Rr][Ee][Rr] +([!-~]+) *$")
  if given ~= token then return 'POST needs "Authorization: Bearer <token>" with fuse.admin\'s token' end
end

-- JSON of an answer. The list of breakers is joined by hand, so that an empty one is
-- still a JSON array with any lua-cjson (2.1.0 has no empty_array).
function _M.encode(body)
  cjson = cjson or require "cjson.safe"
  if not body.breakers then return cjson.encode(body) end
  local items = {}
  for i, b in ipairs(body.breakers) do items[i] = cjson.encode(b) end
  return '{"breakers":[' .. concat(items, ",") .. '],"next":'
    .. (body.next and cjson.encode(body.next) or "null") .. "}"
end

-- Why a POST's body is not a form the endpoint reads, or nil. content_type: its
-- Content-Type header (a table when repeated); query: its query string, or nil.
-- get_post_args reads any body as a form, whatever its type: a JSON body
-- {"name":"x",...} was one field named after the whole body, and answered "missing
-- name"; so were fields sent in the query string.
function _M.not_a_form(content_type, query)
  if query ~= nil and query ~= "" then
    return "a POST takes its fields in a form body (curl -d 'name=N&action=A'), not in the query string"
  end
  if content_type == nil then return nil end  -- (a client that names no type: read as a form)
  local media = type(content_type) == "string" and content_type:match("^%s*([^;%s]*)") or nil
  if media and media:lower() == "application/x-www-form-urlencoded" then return nil end
  return "a POST's body is a form, Content-Type: application/x-www-form-urlencoded (as curl -d "
    .. "sends it), got Content-Type " .. show(content_type)
end

-- The form of a POST, or nil and why it cannot be read: a body larger than
-- client_body_buffer_size, which nginx keeps in a temp file (get_post_args reads none),
-- or more than 100 fields (get_post_args' "truncated").
local function form(ngx)
  ngx.req.read_body()
  if ngx.req.get_body_file() then return nil, "larger than client_body_buffer_size" end
  local args, err = ngx.req.get_post_args()
  if err then return nil, err end
  return args
end

local function answer(ngx, status, body)
  ngx.status = status
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Cache-Control"] = "no-store"
  if status == 405 then ngx.header["Allow"] = "GET, HEAD, POST" end
  ngx.say(_M.encode(body))
  return ngx.exit(status)
end

-- fuse.admin([opts]): a content_by_lua* handler. GET needs nothing; a POST needs the
-- token of opts.token and no cross-site marks (403 otherwise), so that no web page can
-- drive it. Put it on a listener of its own, with allow/deny, too.
function _M.admin(opts)
  local o = options.check_admin(opts, 3)
  local ngx = ngx_api("fuse.admin")
  local method, args = ngx.req.get_method(), nil
  if method == "POST" then
    local headers = ngx.req.get_headers()
    local why = _M.refused(headers, o.token)
    if why then return answer(ngx, 403, { error = why }) end
    why = _M.not_a_form(headers["content-type"], ngx.var.args)
    if why then return answer(ngx, 400, { error = why }) end
    local err
    args, err = form(ngx)
    if not args then
      return answer(ngx, 413, { error = "the form is too large to read (" .. err .. "): "
        .. "name=N&action=A[&seconds=S] is a few bytes" })
    end
  elseif method == "GET" or method == "HEAD" then
    args = ngx.req.get_uri_args()
  end
  return answer(ngx, _M.handle(method, args))
end

---------------------------------------------------------------------------- reject

-- Retry-After in whole seconds for a rejection: rounded up, at least 1.
function _M.retry_after(rej)
  return max(1, ceil(rej.retry_after))
end

-- fuse.reject(rej [, status]): answers the rejection and ends the request.
function _M.reject(rej, status)
  if not fuse.is_rejection(rej) then
    error("fuse: fuse.reject needs a rejection, got " .. show(rej), 2)
  end
  if status ~= nil and (type(status) ~= "number" or status ~= floor(status) or status < 400 or status > 599) then
    error("fuse: fuse.reject's status must be an HTTP status from 400 to 599, got " .. show(status), 2)
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
-- call fn(nil, "overrun", n). An error in fn is reported through fuse.report_error (and
-- when that raises too, through nginx's log or stderr) and never stops the watch: the
-- poll goes on with the next transition. It starts from the newest event at the time it
-- is made.
-- fn may yield (a cosocket, ngx.sleep): ngx.timer.every starts the next poll at its time
-- whether the one before ended or not, and two polls delivering at once would call fn
-- out of order and concurrently. So a poll that finds the one before still delivering
-- does nothing (returns nil): that one goes on, and the first poll after it takes what
-- came meanwhile. Unless that one's coroutine is dead: fn called ngx.exit, which ends
-- the timer's coroutine from inside pcall, so that the poll never got to its end.
function _M.poller(fn)
  local _, _, since = fuse.events()
  local busy  -- the coroutine of the poll that delivers, while it does (nil: none, or main)
  local function call(...)
    local ok, err = pcall(fn, ...)
    if not ok then
      local shown, text = pcall(tostring, err)
      fuse._report("fuse: a fuse.watch callback failed: " .. (shown and text or "(an error tostring fails on)"))
    end
  end
  return function()
    if busy and co_status(busy) ~= "dead" then return nil end
    busy = co_running()
    local list, lost, upto = fuse.events(since)
    since = upto
    if lost > 0 then call(nil, "overrun", lost) end
    for _, e in ipairs(list) do call(e.name, e.from, e.to, e) end
    busy = nil
    return #list, lost
  end
end

-- The phases fuse.watch starts in: init_worker_by_lua*, or a timer (one started there,
-- say). In init_by_lua* (the master) ngx.timer.every raised "no request"; in a request's
-- phase each call started one more watch, for the worker's life.
local WATCH_PHASES = { init_worker = true, timer = true }

-- fuse.watch(fn [, interval]): in init_worker_by_lua*, fn(name, from, to) in this
-- worker for every transition any worker makes, polled every `interval` seconds (0.5).
function _M.watch(fn, interval)
  options.check_callable(fn, "fuse.watch", 2)  -- (callable: as fuse.wrap's fn)
  if interval ~= nil and (type(interval) ~= "number" or not (interval >= 0.001 and interval <= 3600)) then
    error("fuse: fuse.watch's interval must be seconds from 0.001 to 3600, got " .. show(interval), 2)
  end
  local ngx = ngx_api("fuse.watch")
  local phase = ngx.get_phase and ngx.get_phase()
  if phase and not WATCH_PHASES[phase] then
    error("fuse: fuse.watch belongs in init_worker_by_lua* (it watches for the worker's life), not in "
      .. (phase == "init" and "init_by_lua* (the master, which runs no timers)" or "the " .. phase .. " phase"), 2)
  end
  local poll = _M.poller(fn)
  return ngx.timer.every(interval or 0.5, function(premature)
    if not premature then poll() end
  end)
end

return _M
