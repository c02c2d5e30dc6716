-- fuse.pending: guarded calls that end their request (OpenResty), counted by fuse.settle().
--
-- ngx.exit, ngx.exec and ngx.redirect yield out of the request's coroutine, which nginx
-- never resumes: a guarded function that calls one never returns to its guard, so the
-- call would count nowhere (and a probe would hold its slot until probe_timeout, then
-- count as a failure). So under nginx the guard notes each call in flight with its
-- request before it runs the function (track) and strikes it off when the function
-- returns (untrack). What is left when the request ends was ended by the request, and
-- fuse.settle(), in the log phase, counts it by the response status (settle_request).
--
-- Without fuse.settle(), the next request that nginx places at the same address finds the
-- leftovers of the earlier one (another start time): they are counted as ignored (a
-- probe gives its slot back) and a warning goes to the error log, once per worker.
--
-- A list per request address: { start = the request's start time, n = entries, then
-- entry j in slots 5j-4 (the guard's settle function, false once struck off), 5j-3
-- (what settle is given first: the breaker object), 5j-2 (the ticket), 5j-1 (the start
-- of the call, for the slow rule) and 5j (the handle whose permit the call holds, for
-- max_concurrent, or false) }. Outside nginx (or
-- without OpenResty's LuaJIT and lua-resty-core) `enabled` is false and the guard never
-- calls in here.
local _M = { enabled = false }

local ngx = rawget(_G, "ngx")
local ok_ffi, ffi = pcall(require, "ffi")
local ok_ex, exdata = pcall(require, "thread.exdata")  -- OpenResty's LuaJIT: the request of this coroutine

if not (ngx and ok_ffi and ok_ex and type(ngx.config) == "table"
    and ngx.config.subsystem == "http") then
  return _M
end

local C = ffi.C
local ok_sym = pcall(function() return C.ngx_http_lua_ffi_req_start_time end)  -- declared by resty.core
if not ok_sym then return _M end

_M.enabled = true

local tonumber, cast = tonumber, ffi.cast
local UINTPTR = ffi.typeof("uintptr_t")
local req_start = C.ngx_http_lua_ffi_req_start_time
local ok_sub = pcall(function() return C.ngx_http_lua_ffi_is_subrequest end)  -- (resty.core.misc)
local is_sub = ok_sub and C.ngx_http_lua_ffi_is_subrequest
local newproxy, getmetatable, setmetatable, pairs = newproxy, getmetatable, setmetatable, pairs
local WEAK_KEYS = { __mode = "k" }

local lists = {}   -- request address -> list
local spare = {}   -- lists of ended requests, for reuse
local warned = false

local SUCCESS, FAILURE, IGNORE = 0, 1, 2

local HOOK = 'log_by_lua_block { require("fuse").settle() }'

-- Counts the entries of `p` as `outcome` and empties it.
local function settle_all(p, outcome)
  for j = 1, p.n do
    local i = 5 * j
    local settle = p[i - 4]
    if settle then
      p[i - 4] = false
      settle(p[i - 3], p[i - 2], p[i - 1], outcome, p[i])
    end
  end
  p.n = 0
end

-- The calls of subrequest list p that hold a permit (their own lists, see orphan, noted
-- in p.orphans, weakly) counted as `outcome`.
local function settle_orphans(p, outcome)
  local w = p.orphans
  if not w then return end
  p.orphans = nil
  for o in pairs(w) do settle_all(o, outcome) end
end

-- The entries of a request that ended without fuse.settle(): counted as ignored, and said;
-- its subrequests' calls that hold a permit too (nginx ran no log phase for them).
local function leftover(p)
  for j = 1, p.n do
    if p[5 * j - 4] then
      if not warned then
        warned = true
        ngx.log(ngx.WARN, "fuse: a guarded function ended its request (ngx.exit, ngx.exec or ",
          "ngx.redirect) and no fuse.settle() ran in the log phase to count the call by the ",
          "response status: it was counted as ignored. Add ", HOOK, " to the http block (or to ",
          "every location that has a log_by_lua* of its own). This is logged once per worker.")
      end
      break
    end
  end
  settle_all(p, IGNORE)
  settle_orphans(p, IGNORE)
end

-- The list of request r (at address key, started at start); made or reused as needed.
-- sub: r is a subrequest, whose log phase nginx never runs (it runs the main request's).
local function list_of(r, key, start)
  local p = lists[key]
  if p == nil then
    local n = #spare
    if n > 0 then p = spare[n]; spare[n] = nil else p = { n = 0 } end
    lists[key] = p
  elseif p.start ~= start then
    leftover(p)
  else
    return p
  end
  p.start, p.sub = start, is_sub and is_sub(r) == 1
  return p
end

-- A call that no log phase may settle (in a timer, or in a subrequest: nginx runs its
-- log phase only with `log_subrequest on`): a list of its own, which the guard holds
-- while the function runs. A function that ends its timer or subrequest (ngx.exit)
-- never returns: nginx drops its coroutine, and the list with it, and a finalizer (of a
-- userdata only the list holds) counts the call as ignored and gives its permit back at
-- the worker's next garbage collection (protected: an error raised in a finalizer would
-- surface in whatever code the collection interrupted), unless the subrequest's log
-- phase settled it first (its list notes the call, weakly: p.orphans).
local function orphan(settle, ctx, ticket, t0, ph)
  local p = { n = 1, settle, ctx, ticket, t0, ph or false }
  local u = newproxy(true)
  getmetatable(u).__gc = function() if p[1] then pcall(settle_all, p, IGNORE) end end
  p.gc = u
  return p, 1
end

local function trim(p, n)
  repeat n = n - 1 until n == 0 or p[5 * n - 4]
  p.n = n
end

-- Notes a call in flight (the guard's settle(ctx, ticket, t0, outcome, ph), its ticket,
-- start and permit handle ph or false); returns the list and the entry, to strike it off
-- with untrack, or nil outside a request.
function _M.track(settle, ctx, ticket, t0, ph)
  local r = exdata()
  if r == nil then return nil end
  local start = req_start(r)
  -- a fake request (timer, init_worker), or a subrequest: a call that holds a permit of
  -- max_concurrent gets a list of its own (a breaker without the option pays nothing new)
  if start == 0 then return ph and orphan(settle, ctx, ticket, t0, ph) or nil end
  local p = list_of(r, tonumber(cast(UINTPTR, r)), start)
  if p.sub and ph then
    local o, k = orphan(settle, ctx, ticket, t0, ph)
    local w = p.orphans
    if not w then
      w = setmetatable({}, WEAK_KEYS)
      p.orphans = w
    end
    w[o] = true
    return o, k
  end
  local n = p.n + 1
  p.n = n
  local i = 5 * n
  p[i - 4], p[i - 3], p[i - 2], p[i - 1], p[i] = settle, ctx, ticket, t0, ph or false
  return p, n
end

-- Strikes off entry n of list p: the function returned to the guard.
function _M.untrack(p, n)
  p[5 * n - 4] = false
  if n == p.n then
    if n > 1 and not p[5 * n - 9] then return trim(p, n) end
    p.n = n - 1
  end
end

-- fuse.settle(): in the log phase, counts the calls of this request that ended it: a
-- failure for a status of 500 or above, ignored for 499 (the client went away) or no
-- status at all, else a success.
function _M.settle_request(status)
  local r = exdata()
  if r == nil then return end
  local key = tonumber(cast(UINTPTR, r))
  local p = lists[key]
  if p == nil then return end
  if p.start ~= req_start(r) then
    leftover(p)
  else
    local outcome = status >= 500 and FAILURE or (status == 499 or status < 100) and IGNORE or SUCCESS
    settle_all(p, outcome)
    settle_orphans(p, outcome)  -- (a subrequest's log phase: log_subrequest on)
  end
  lists[key] = nil
  if #spare < 64 then spare[#spare + 1] = p end
end

return _M
