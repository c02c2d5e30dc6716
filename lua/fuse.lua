-- fuse: circuit breakers for Lua, over a lock-free C core.
--
-- This is the facade: it validates options once (fuse.options), builds guarded
-- functions and breaker objects, fires listeners, and formats stats. The backend
-- (fuse.ffi under LuaJIT) is a thin layer of one-line calls into the core. Off the hot
-- path, one concern a module: fuse.objects (the objects' maps by name), fuse.events,
-- fuse.settle (OpenResty's log phase) and fuse.metrics (exposition, shared counters).
local options = require "fuse.options"

-- The backend: the FFI under LuaJIT with its ffi library, else the C module fuse.core.
local B
if rawget(_G, "jit") and pcall(require, "ffi") then
  B = require "fuse.ffi"
else
  local ok, core = pcall(require, "fuse.core")
  if not ok then
    error("fuse: no backend: not LuaJIT with its ffi library, and the C module fuse.core "
      .. "did not load: " .. tostring(core), 2)
  elseif type(core) ~= "table" or core.name ~= "capi" then
    error("fuse: the fuse.core found on package.cpath is not fuse's C module", 2)
  end
  B = core
end

local pending = require "fuse.pending"
local objmaps = require "fuse.objects"

local error, ipairs, pairs, pcall, select, setmetatable, tostring, type = error, ipairs, pairs, pcall,
  select, setmetatable, tostring, type
local getmetatable = getmetatable
-- A breaker method's check of self: debug.getmetatable reads the metatable alone, where
-- getmetatable also looks for a __metatable field in it (no breaker's has one, so both say
-- the same), a hash search in every call's trace.
local meta_of = debug and debug.getmetatable or getmetatable
local floor = math.floor
local huge = math.huge
local show = options.show  -- how every message shows a value
local concat = table.concat
local unpack = table.unpack or unpack  -- luacheck: ignore 143

local _M = { VERSION = "0.2.0", _backend = B.name }

local STATES = { [0] = "closed", "open", "half_open", "forced_open", "disabled" }
local OPEN, HALF_OPEN, REMOVED = 1, 2, 5
local SUCCESS, FAILURE, IGNORE = 0, 1, 2
local OPEN_TO_HALF = 64 + OPEN * 8 + HALF_OPEN
local HALF_TO_OPEN = 64 + HALF_OPEN * 8 + OPEN
-- forced_open -> open -> half_open: the lift of a timed forced_open (two codes, packed)
local LIFTED = 64 + 3 * 8 + OPEN + 128 * OPEN_TO_HALF
local PLAIN_OPEN_REJECTION = -(1 + OPEN * 4)
local PLAIN_FORCED_REJECTION = -(1 + 3 * 4)  -- forced_open, no transition made
local STALE = -(1 + 7 * 4)  -- fz_enter_id: the handle's breaker was removed or evicted
local FULL = -(1 + 6 * 4)   -- fz_enter_limit: max_concurrent calls are running
local PASS_TICKET = 3 * 2   -- a ticket fz_done counts nowhere (kind 3, generation 0)
local E_MISMATCH, E_FULL, E_TICKET, E_REPORTED, E_STALE = -4, -3, -7, -9, -10

-- The core's functions that guarded calls use, called straight from the guarded-call
-- code: under LuaJIT the ffi namespace of the core library (B.lib), so that no small Lua
-- function stands between a call and the core. LuaJIT starts traces at the entries of
-- functions that interpreted code (request handlers, new call sites) calls often, and
-- blacklists an entry whose traces keep aborting; every guarded call would then run
-- interpreted for the rest of the process (spec/12-longlived_spec.lua). Under PUC Lua,
-- the C module's functions under the same names.
local core = B.lib or { fz_enter_id = B.enter, fz_allow_id = B.allow, fz_done = B.done, fz_clock_now = B.clock_now,
  fz_clock_manual = B.clock_manual, fz_retry_after = B.retry_after, fz_permit_take = B.permit_take,
  fz_permit_give = B.permit_give, fz_enter_limit = B.enter_limit, fz_done_limit = B.done_limit }

-- OpenResty: guarded calls in flight are noted with their request, so that a function
-- that ends the request (ngx.exit, ngx.exec, ngx.redirect) is still counted, by fuse.settle()
-- in the log phase. False elsewhere, and then the branches on it compile away.
local TRACK = pending.enabled
local track, untrack = pending.track, pending.untrack

---------------------------------------------------------------------------- the clock

local fake  -- the test clock installed by fuse.clock(fn), or nil

-- The message for a clock reading s that is not seconds within range, or nil.
local function bad_clock(s)
  if type(s) ~= "number" or not (s > -4.5e9 and s < 4.5e9) then
    return "fuse: the clock function must return seconds as a number within 4.5e9 of 0, got "
      .. show(s)
  end
end

-- "file:line: " of the nearest Lua function on the stack outside this file (the code
-- that called fuse), or "" (no debug library, or none found). For errors only.
local SOURCE = debug and debug.getinfo(1, "S").source
local function caller_at()
  if not SOURCE then return "" end
  for level = 2, 64 do
    local info = debug.getinfo(level, "Sl")
    if not info then break end
    if info.source ~= SOURCE and info.what ~= "C" and (info.currentline or 0) > 0 then
      return info.short_src .. ":" .. info.currentline .. ": "
    end
  end
  return ""
end

local function sync()
  local s = fake()
  local msg = bad_clock(s)
  if msg then error(caller_at() .. msg, 0) end
  core.fz_clock_manual(s)
end

-- sync for a guarded call that must record its outcome before it raises (else its
-- ticket, probe slot and max_concurrent permit were never given back): false when the
-- reading is good, else true and fuse's message, to raise once the outcome is recorded
-- (the clock is left where it was). A clock that raises still raises here: a pcall of
-- it made every trace begun at the clock function's entry abort ("return to lower
-- frame"), and LuaJIT blacklists such a function (spec/12-longlived).
local function sync_later()
  local s = fake()
  local msg = bad_clock(s)
  if msg then return true, caller_at() .. msg end
  core.fz_clock_manual(s)
  return false
end

-- fuse.clock(fn): read time (seconds) from fn, for tests; fuse.clock() restores. fn is
-- called, and its reading checked, before it is installed: a clock that raises or
-- answers a bad value leaves the clock as it was.
function _M.clock(fn)
  if fn ~= nil and type(fn) ~= "function" then
    error("fuse: fuse.clock needs a function or nothing, got " .. show(fn), 2)
  end
  if not fn then
    fake = nil
    B.clock_auto()
    return
  end
  local s = fn()
  local msg = bad_clock(s)
  if msg then error(msg, 2) end
  fake = fn
  B.clock_manual(s)
end

local function now()
  if fake then sync() end
  return (core.fz_clock_now())
end

-- fuse.now(): seconds as the breakers read them (monotonic; the fuse.clock function when
-- one is installed). fuse.upstream times its slow-start ramps with it.
function _M.now() return now() end

---------------------------------------------------------------------------- protected calls

-- pcall(call, fn, ...) is pcall(fn, ...) with every result, for the functions fuse calls
-- on the user's behalf (the guarded function, is_failure, listeners). Under LuaJIT a
-- function that pcall calls directly cannot be a trace root: a trace that starts at its
-- entry (interpreted callers make it hot) cannot return into pcall's frame and aborts,
-- and after a dozen aborts the function is blacklisted: it runs interpreted, and every
-- trace that reaches it aborts, for the rest of the process. Here fn returns into
-- `call`, a Lua frame; and LuaJIT never starts a trace at a vararg function's entry, so
-- `call` itself is never a root. select(1, ...) keeps the call to fn from being a tail
-- call (a tail call would return into pcall again) and passes every result.
-- So under LuaJIT a guarded Lua function's caller is `call`: an error it raises with
-- error(msg, 2) carries this line's position, where under PUC Lua (pcall its caller) it
-- carries none (docs/api.md, fuse.wrap).
local function call(fn, ...) return select(1, fn(...)) end
local function protected(fn, ...) return pcall(call, fn, ...) end

-- A C function (or a callable table) is pcall'd directly, as before: it is never a trace
-- root, and through `call` an error it raises with a position (error("x"), luaL_error)
-- would name fuse's line. Only LuaJIT needs the trampoline.
local TRAMPOLINE = B.name == "ffi"
local direct_fns = setmetatable({}, { __mode = "k" })
local function is_direct(fn)
  if not TRAMPOLINE then return true end
  local d = direct_fns[fn]
  if d == nil then
    d = type(fn) ~= "function" or debug.getinfo(fn, "S").what == "C"
    direct_fns[fn] = d
  end
  return d
end

---------------------------------------------------------------------------- listeners

-- The default reporter: nginx's error log, else stderr.
local function default_report(msg)
  local ngx = rawget(_G, "ngx")
  if ngx and ngx.log then ngx.log(ngx.ERR, msg) else io.stderr:write(msg, "\n") end
end

-- Where an error raised by an on_state_change listener is reported. Replaceable.
_M.report_error = default_report

-- Reports msg through fuse.report_error; when that is not callable or raises, through
-- the default reporter, saying why. Never raises: a listener never breaks a call.
local function report(msg)
  local ok, err = pcall(_M.report_error, msg)
  if ok then return end
  pcall(default_report, msg .. " (fuse.report_error failed: " .. tostring(err) .. ")")
end
_M._report = report  -- (for fuse.watch's callback errors, lua/fuse/admin.lua)

local function fire(listener, name, code)
  if code >= 128 then  -- two transitions made by one call (a timed forced_open lifted, ...)
    fire(listener, name, code % 128)
    return fire(listener, name, floor(code / 128))
  end
  if code < 64 then return end
  local f, t = floor((code - 64) / 8), (code - 64) % 8
  if name ~= nil then B.event(name, f, t) end  -- fuse.events: every transition of a named breaker
  if listener == nil then return end
  local from, to = STATES[f], STATES[t]
  local ok, err = pcall(call, listener, name, from, to)
  if not ok then
    report("fuse: on_state_change of breaker '" .. (name or "anonymous") .. "' ("
      .. from .. " -> " .. to .. ") failed: " .. tostring(err))
  end
end

---------------------------------------------------------------------------- rejections

-- A rejection is made once per breaker and state and shared by every call it rejects,
-- so it is read-only: it holds only its object and its kind, under private keys, and
-- assigning any field raises (__newindex runs for every key but those). Its fields are
-- read from the object (its name, and its handle now, which follows the object when its
-- name is found again after a removal). One table a rejection: made on a call's first
-- meeting with that state, never for an object whose calls all pass.
local REJ = {}
local OBJ, KIND = {}, {}  -- the private keys: the object, and 1..3 (the state) or 4 (full)
local REJ_STATES = { "open", "half_open", "forced_open" }

-- The circuit's state now, for a rejection for the limit (a pure read: no transition).
local function state_now(h)
  local s = {}
  B.peek(h, s)
  return STATES[s.state] or "closed"
end

REJ.__index = function(r, k)
  local br, i = r[OBJ], r[KIND]
  if k == "retry_after" then
    if i == 4 then return 0 end
    if fake then sync() end
    return (core.fz_retry_after(br._h))
  elseif k == "name" then return br.name
  elseif k == "reason" then return i == 4 and "full" or "open"
  elseif k == "state" then
    if i == 4 then return state_now(br._h) end
    return REJ_STATES[i]
  elseif k == "limit" and i == 4 then return br.cfg.max_concurrent end
end
REJ.__newindex = function(_, k)
  error("fuse: a rejection is read-only (it is shared by every call its breaker rejects): cannot set "
    .. (type(k) == "string" and "'" .. k .. "'" or "a field"), 2)
end
REJ.__tostring = function(r)
  local br = r[OBJ]
  if r[KIND] == 4 then
    return ("fuse: breaker '%s' is full (%d calls running)"):format(br.name or "anonymous", br.cfg.max_concurrent)
  end
  return "fuse: circuit '" .. (br.name or "anonymous") .. "' is open"
end

---------------------------------------------------------------------------- max_wait

local ngx_now, ngx_sleep, ngx_update_time
do
  local ngx = rawget(_G, "ngx")
  if type(ngx) == "table" and type(ngx.sleep) == "function" then
    ngx_now, ngx_sleep, ngx_update_time = ngx.now, ngx.sleep, ngx.update_time
  end
end
local min, max = math.min, math.max

-- Waits up to max_wait seconds for a permit of h (OpenResty: yields with ngx.sleep, in
-- steps from 1 ms doubling up to 20 ms); true when one was taken. A phase where
-- ngx.sleep is not allowed (the error is caught) gives up at once. A step is 1 ms at
-- least: ngx.sleep takes whole milliseconds, and a sleep of 0 ms (what is left of the
-- wait, below 1 ms, or a rounding of 1 ms below it) resumes from nginx's posted events
-- without the loop's time moving, so ngx.now() and `left` never change: a worker spun.
-- The wait is timed on the core's monotonic clock, read now: ngx.now() is the time the
-- event loop read when its iteration began, behind by whatever ran since (this
-- request's own work, other requests'), and even after ngx.update_time() it is the wall
-- clock cut to the millisecond, while nginx fires timers on its own millisecond of
-- another clock: a wait timed with it ended up to 1.3 ms short of max_wait (CI: 0.1987 s
-- of 0.2). Now it lasts max_wait at least (a sleep that wakes early sleeps 1 ms more).
-- With a fuse.clock installed (tests), whose time need not move while this sleeps,
-- nginx's clock times it, as before.
local function wait_permit(h, max_wait)
  local clock = ngx_now
  if fake then
    if ngx_update_time then ngx_update_time() end
  else
    clock = core.fz_clock_now
  end
  local deadline, step = clock() + max_wait, 0.001
  while true do
    local left = deadline - clock()
    if left <= 0 or not pcall(ngx_sleep, max(min(step, left), 0.001)) then return false end
    if core.fz_permit_take(h, 0) == 1 then return true end
    step = min(step * 2, 0.02)
  end
end

-- A permit of h for a call: 1 taken (at once, or after waiting up to max_wait), else 0
-- and the rejection counted (full_total). The results are parenthesized: never a tail
-- call into C, which a trace that starts at this function's entry cannot record.
local function permit(h, max_wait)
  if max_wait == 0 then return (core.fz_permit_take(h, 1)) end
  if core.fz_permit_take(h, 0) == 1 or wait_permit(h, max_wait) then return 1 end
  return (core.fz_permit_take(h, 1))  -- a last try, which counts the rejection
end

-- A guarded call of a breaker with max_concurrent and max_wait that found the limit
-- reached (fz_enter_limit's FULL, not counted): waits for a permit, then enters as
-- fz_enter_limit does (a rejection by the circuit gives the permit back). Apart from the
-- call path, which stays one call into the core to enter.
local function enter_waited(h, id, max_wait)
  if not wait_permit(h, max_wait) and core.fz_permit_take(h, 1) == 0 then return FULL end  -- (counted)
  local t = core.fz_enter_id(h, id)
  if t < 0 then core.fz_permit_give(h) end
  return t
end

function _M.is_rejection(v) return type(v) == "table" and getmetatable(v) == REJ end

-- The object br's rejection in state i (OPEN, HALF_OPEN or FORCED_OPEN), or 4: a call
-- past max_concurrent; made on first need: an object whose calls pass makes none, the
-- others only when a call meets that state (br.rejs: the four, false before the first).
local function rej_of(br, i)
  local rejs = br.rejs
  if not rejs then
    rejs = { false, false, false, false }
    br.rejs = rejs
  end
  local r = rejs[i]
  if not r then
    r = setmetatable({ [OBJ] = br, [KIND] = i }, REJ)
    rejs[i] = r
  end
  return r
end

-- The transitions an admitted ticket t with its flag set made: open -> half_open, or
-- for a probe of kind 0 the lift of a timed forced_open (forced_open -> open -> half_open).
local function made_by(t)
  if t % 8 == 1 then return LIFTED end
  return OPEN_TO_HALF
end

-- The rejection for a negative ticket, firing the transition the rejected call made.
local function rejected(br, listener, t)
  local r = -t - 1
  local made = r % 4
  if made == 1 then fire(listener, br.name, OPEN_TO_HALF)
  elseif made == 2 then fire(listener, br.name, HALF_TO_OPEN)
  elseif made == 3 then fire(listener, br.name, LIFTED) end
  return rej_of(br, floor(r / 4))
end

---------------------------------------------------------------------------- stale handles

-- Makes h (identity id), the breaker br's name has now, the object's own handle.
local function adopt(br, h, id)
  -- the handles it had before, newest first: b:report of a ticket one of them issued
  local was = br._was or {}
  table.insert(was, 1, br._h)
  was[5] = nil
  br._was = was
  br._h, br._id = h, id  -- (its rejections read the handle from the object)
  return h, id
end

-- A named breaker object whose breaker was removed or evicted finds its name again,
-- creating it (closed, fresh) with its own options when missing. Returns the live handle
-- and identity, or nil when the registry is full (counted in fuse_registry_full_total).
-- stale_id: the identity the core just answered FZ_STALE for. The object's own handle
-- is then never taken back on its identity alone: a breaker retired by a removal keeps
-- its identity until the remover drops it, for ever if the remover died there; only the
-- registry's lock (taken by B.open) repairs that.
-- br._keep (set by fuse.upstream on its peers' breakers, else absent): a function that
-- says whether the name is still wanted (its pool open and holding the peer). Not wanted:
-- the name is not made again, and nil is returned (the call runs unguarded, as with a
-- full registry, and is not counted as one); checked again once the name is made, since
-- a close elsewhere may come between the check and the making: then the breaker made here
-- goes again (by name, when the name still has that identity).
local function refind(br, stale_id)
  local h, id = br._h, br._id
  if id ~= stale_id and B.id(h) == id then return h, id end  -- another wrap of this object re-found it
  if fake then sync() end
  local keep = br._keep
  if keep and not keep() then return nil end
  local st
  h, st, id = B.open(br.name, br.cfg)  -- other options there: that is the name's breaker now
  if not h then
    B.full_add()
    return nil
  end
  if st == 1 and keep and not keep() then  -- (1: made by this call)
    local _, now_id = B.find(br.name)
    if now_id == id then B.remove(br.name) end
    return nil
  end
  return adopt(br, h, id)
end

-- The handle to act on: the object's own, or its name's again when it went stale.
local function live(br)
  local h = br._h
  if br._id == 0 or B.id(h) == br._id then return h end
  return refind(br)
end

-- The handle to read (state, stats): the object's own while it lives, else the breaker
-- its name has now, or nil when the name has none: a read never creates a breaker.
-- stale_id: an identity the core answered as gone (the breaker is retired while its
-- identity has not moved yet), never taken back on its identity alone (see refind).
local function readable(br, stale_id)
  local h, id = br._h, br._id
  if id == 0 or (id ~= stale_id and B.id(h) == id) then return h end
  h, id = B.find(br.name)
  if not h or id == stale_id then return nil end
  return (adopt(br, h, id))
end

-- A manual state through the object: `act` (a B.*_id function) on its breaker, checked
-- in the core against the handle's identity under the registry's lock, so that it never
-- lands on a breaker that took the slot over (a removal or an eviction, then a reuse,
-- between a check here and the act). Gone: its name found again, or re-created, as a
-- call would. Returns the transition code, or nil when the registry is full.
local function manual_act(br, act, seconds)
  local h, id = live(br), br._id
  while h do
    local code = act(h, id, seconds)
    if code ~= E_STALE then return code end
    h, id = refind(br, id)
  end
end

-- An outcome the core would not count through the handle the call finished on: the
-- handle changed while the call ran (E_TICKET: the ticket is an earlier handle's), or an
-- idle eviction retired the breaker while the call ran (E_STALE: the outcome is its
-- name's, counted into the breaker the name has now, found again or re-created). Returns
-- the code to fire. Off the hot path: only for the codes above.
local function earlier(br, ticket, outcome, seconds)
  local code = E_TICKET
  for _, h in ipairs(br._was or {}) do
    code = core.fz_done(h, ticket, outcome, seconds)
    if code ~= E_TICKET then return code end
  end
  return code
end

local function late(br, ticket, outcome, seconds, code)
  if code == E_TICKET then code = earlier(br, ticket, outcome, seconds) end
  if code ~= E_STALE then return code end
  local h, id = live(br), br._id
  for _ = 1, 3 do  -- (again only when that breaker went too, meanwhile)
    if not h then return 0 end  -- a full registry: counted in fuse_registry_full_total
    code = B.late_id(h, id, outcome, seconds)
    if code ~= E_STALE then return code end
    h, id = refind(br, id)
  end
  return 0
end

---------------------------------------------------------------------------- guarded calls

-- What judged returns for an is_failure that answered neither true, false nor nil (the
-- answer in `got`): misjudged makes the message, with the breaker and the caller's line.
local BadAnswer = {}

local function judged(ok, v)
  if not ok then return nil, v end
  if v == true then return FAILURE elseif v == false then return SUCCESS elseif v == nil then return IGNORE end
  return nil, setmetatable({ got = v }, BadAnswer)
end

-- The default failure rule, or the user's is_failure: FAILURE, SUCCESS or IGNORE; or
-- nil and the error when is_failure raised, or a BadAnswer when it answered something
-- else.
local function classify(is_failure, ok, ...)
  if is_failure == nil then
    if not ok then return FAILURE end
    local r1, r2 = ...
    if r1 == nil and r2 ~= nil then return FAILURE end
    return SUCCESS
  end
  return judged(pcall(call, is_failure, ok, ...))
end

-- The failure a fallback is given: the raised error, or of `nil, err` the err.
local function failure_of(ok, r1, r2)
  if not ok then return r1 end
  if r1 == nil then return r2 end
  return r1
end

-- values(t, n): t[1], ..., t[n], for any n a bare call could pass. unpack gives at most
-- 8000 values under LuaJIT and Lua 5.1; beyond MAX_UNPACK the rest are put in front,
-- CHUNK at a time, by a tail call that takes them as fixed arguments (generated below),
-- so the stack never holds more than two copies of them, as a bare call's would.
local MAX_UNPACK, CHUNK = 7000, 100
local prepend  -- prepend(t, i, ...): t[1], ..., t[i], ...
do
  local slots = {}
  for j = CHUNK - 1, 0, -1 do slots[#slots + 1] = "t[i - " .. j .. "]" end
  local src = ([[
local step
step = function(t, i, ...)
  if i >= %d then return step(t, i - %d, %s, ...) end
  if i == 0 then return ... end
  return step(t, i - 1, t[i], ...)
end
return step]]):format(CHUNK, CHUNK, concat(slots, ", "))
  prepend = assert((rawget(_G, "loadstring") or load)(src, "=fuse.values"))()
end

local function values(t, n)
  if n <= MAX_UNPACK then return unpack(t, 1, n) end
  return prepend(t, n - MAX_UNPACK, unpack(t, n - MAX_UNPACK + 1, n))
end

-- Above MANY arguments a guarded call keeps them in a table while fn runs, not on the
-- stack (where a Lua state has room for about 65,000 values), so that it holds no more
-- copies of them than a bare call does: whatever the bare call can pass, it can.
local MANY = 1000
-- (vararg only so that it is never a trace root either, as `call`)
local function call_unpacked(fn, rest, n, ...) return fn(values(rest, n)) end  -- luacheck: ignore 212

-- fallback(err, ...) with the call's arguments, kept in fixed slots for up to eight
-- (no allocation); only a call with more arguments keeps them in a table.
local function call_fallback(fb, err, n, a1, a2, a3, a4, a5, a6, a7, a8, rest)
  if rest then return fb(err, values(rest, n)) end
  if n <= 4 then
    if n == 0 then return fb(err) elseif n == 1 then return fb(err, a1)
    elseif n == 2 then return fb(err, a1, a2) elseif n == 3 then return fb(err, a1, a2, a3) end
    return fb(err, a1, a2, a3, a4)
  end
  if n == 5 then return fb(err, a1, a2, a3, a4, a5) elseif n == 6 then return fb(err, a1, a2, a3, a4, a5, a6)
  elseif n == 7 then return fb(err, a1, a2, a3, a4, a5, a6, a7) end
  return fb(err, a1, a2, a3, a4, a5, a6, a7, a8)
end

-- make_run(...) -> go: go(br, fn, ...) is one guarded call of fn over object br, with
-- this fallback, is_failure and listener; direct: fn is pcall'd directly (else through
-- `call`); slow, limit (max_concurrent) and max_wait: its options. Every object made
-- with the same options shares one go (shared_run below): a called object costs no
-- closure, and a gateway's one set of options is one closure of each function here, so
-- that under LuaJIT the trace of a call specializes to it and its immutable upvalues
-- fold: a breaker without max_concurrent (limit false) never reaches the permit code.
-- The object's handle and identity are read from it on each call (refind moves them).
local function make_run(fallback, is_failure, listener, direct, slow, limit, max_wait)
  local protect = direct and pcall or protected
  local has_fallback = fallback ~= nil
  local fb_fn = type(fallback) == "function"
  local count_full = max_wait == 0 and 1 or 0  -- (with max_wait, enter_waited counts it)

  -- ph: the handle whose permit the call holds (max_concurrent), given back here, with
  -- the outcome (in the same call into the core, unless a re-find moved the object's
  -- handle meanwhile).
  local function record(br, t, t0, outcome, ph)
    local elapsed, bad, err = -1, false, nil
    if fake then bad, err = sync_later() end
    if slow then elapsed = core.fz_clock_now() - t0 end
    local h = br._h
    local code
    if not limit then code = core.fz_done(h, t, outcome, elapsed)
    elseif ph == h then code = core.fz_done_limit(h, t, outcome, elapsed)
    else
      core.fz_permit_give(ph)
      code = core.fz_done(h, t, outcome, elapsed)
    end
    if code ~= 0 then
      if code < 0 then code = late(br, t, outcome, elapsed, code) end
      fire(listener, br.name, code)
    end
    if bad then error(err, 0) end  -- (a test clock's bad reading, once the call is counted)
  end

  -- An is_failure that raised, or answered neither true, false nor nil: the call counts
  -- nowhere (a probe gives its slot back) and the error goes to the caller: the one
  -- is_failure raised as it is, or fuse's, at the line of the guarded call.
  local function misjudged(br, t, ph, err)
    record(br, t, 0, IGNORE, ph)
    if getmetatable(err) == BadAnswer then
      err = caller_at() .. "fuse: is_failure of breaker '" .. (br.name or "anonymous")
        .. "' must return true, false or nil, got " .. show(err.got)
    end
    error(err, 0)
  end

  -- (p, k): under OpenResty, the call's entry in its request's calls in flight, or nil.
  local function finish(br, t, t0, p, k, ph, ok, ...)
    if p then untrack(p, k) end
    local outcome, err = classify(is_failure, ok, ...)
    if not outcome then misjudged(br, t, ph, err) end
    record(br, t, t0, outcome, ph)
    if outcome == FAILURE and has_fallback then return fallback end
    if ok then return ... end
    error((...), 0)
  end

  local function finish_fb(br, t, t0, p, k, ph, n, a1, a2, a3, a4, a5, a6, a7, a8, rest, ok, ...)
    if p then untrack(p, k) end
    local outcome, err = classify(is_failure, ok, ...)
    if not outcome then misjudged(br, t, ph, err) end
    record(br, t, t0, outcome, ph)
    if outcome == FAILURE then
      return call_fallback(fallback, failure_of(ok, ...), n, a1, a2, a3, a4, a5, a6, a7, a8, rest)
    end
    if ok then return ... end
    error((...), 0)
  end

  -- More than MANY arguments: they wait in `rest`, off the stack, while fn runs.
  local function run_many(br, t, t0, p, k, ph, fn, rest, n)
    if fb_fn then
      return finish_fb(br, t, t0, p, k, ph, n, nil, nil, nil, nil, nil, nil, nil, nil, rest,
        pcall(call_unpacked, fn, rest, n))
    end
    return finish(br, t, t0, p, k, ph, pcall(call_unpacked, fn, rest, n))
  end

  -- The rejection of object br in state i, made on its first need.
  local function rej(br, i)
    local rejs = br.rejs
    return rejs and rejs[i] or rej_of(br, i)
  end

  -- The ticket of a call through handle h of identity id. max_concurrent: the permit
  -- first, in the core (a call past the limit touches no circuit; a rejection holds no
  -- permit, the core gave it back). (Parenthesized: never a tail call into C.) max_wait
  -- is tested first: without it the JIT drops the test of t (a guard in every trace).
  local function enter(h, id)
    if not limit then return (core.fz_enter_id(h, id)) end
    local t = core.fz_enter_limit(h, id, count_full)
    if max_wait > 0 and t == FULL then t = enter_waited(h, id, max_wait) end
    return t
  end

  -- The rejection of object br for ticket t < 0, or nil for STALE (the caller calls
  -- again): the plain rejections first (no transition to fire), one compare each in a
  -- trace.
  local function refused(br, t)
    if limit and t == FULL then return rej(br, 4) end
    if t == PLAIN_OPEN_REJECTION then return rej(br, OPEN) end
    if t == PLAIN_FORCED_REJECTION then return rej(br, 3) end
    if t == STALE then return nil end
    return rejected(br, listener, t)
  end

  local go

  -- The breaker went stale (removed or evicted): find or re-create its name and call
  -- again; with a full registry the call runs unguarded.
  local function rerun(br, id, fn, ...)
    if not refind(br, id) then return fn(...) end
    return go(br, fn, ...)
  end

  if fb_fn then
    go = function(br, fn, ...)
      if fake then sync() end
      local h, id = br._h, br._id
      local t = enter(h, id)
      if t < 0 then
        local r = refused(br, t)
        if not r then return rerun(br, id, fn, ...) end
        return fallback(r, ...)
      end
      local ph = limit and h  -- (the handle whose permit the call holds)
      if t % 2 == 1 then fire(listener, br.name, made_by(t)) end
      local t0 = slow and now() or 0
      local p, k
      if TRACK then p, k = track(record, br, t, t0, ph) end
      local n = select("#", ...)
      local a1, a2, a3, a4, a5, a6, a7, a8 = ...
      local rest = n > 8 and { ... } or nil
      if n > MANY then return run_many(br, t, t0, p, k, ph, fn, rest, n) end
      return finish_fb(br, t, t0, p, k, ph, n, a1, a2, a3, a4, a5, a6, a7, a8, rest,
        protect(fn, ...))
    end
    return go
  end
  go = function(br, fn, ...)
    if fake then sync() end
    local h, id = br._h, br._id
    local t = enter(h, id)
    if t < 0 then
      local r = refused(br, t)
      if not r then return rerun(br, id, fn, ...) end
      if has_fallback then return fallback end
      return nil, r
    end
    local ph = limit and h  -- (the handle whose permit the call holds)
    if t % 2 == 1 then fire(listener, br.name, made_by(t)) end
    local t0 = slow and now() or 0
    local p, k
    if TRACK then p, k = track(record, br, t, t0, ph) end
    local n = select("#", ...)
    if n > MANY then return run_many(br, t, t0, p, k, ph, fn, { ... }, n) end
    return finish(br, t, t0, p, k, ph, protect(fn, ...))
  end
  return go
end

---------------------------------------------------------------------------- breakers

local Breaker = {}
Breaker.__index = Breaker

-- An object is cheap to make: one table of seven fields (eight hash slots) and no
-- closure; its guarded-call function (_run: one its options share, see shared_run) is
-- found on its first call, and its rejections (rejs) are made when a call meets them.
-- _opts: the options of the fuse.new call that made it (fuse.new of those options gives
-- it again). fallback, is_failure and on_state_change are set only when given.
-- Under Lua 5.1 (the C module) a finalizer runs in the cycle that found its object
-- unreachable, and every unreachable handle is finalized in that same cycle, before the
-- objects made earlier: an anonymous breaker's handle would be freed before a finalizer
-- that reaches its object (and calls through it) runs. A weak-keyed table marks its
-- values strongly: the handle stays one collection longer than its object.
local anchor = B.name == "capi" and _VERSION == "Lua 5.1" and setmetatable({}, { __mode = "k" })

local function make_breaker(h, id, name, cfg, o)
  -- (fields a call reads are set, false when unused: a field missing from the object is
  -- a hash search in it and then in Breaker at every read in a trace)
  -- (_limit: max_concurrent is set; what allow and the guards read)
  local br = setmetatable({ _h = h, _id = id, name = name, cfg = cfg, _opts = false,
    rejs = false, _run = false, _held = false, _limit = cfg.max_concurrent > 0 }, Breaker)
  if anchor and id == 0 then anchor[br] = h end
  if o.fallback ~= nil then br.fallback = o.fallback end
  if o.is_failure ~= nil then br.is_failure = o.is_failure end
  if o.on_state_change ~= nil then br.on_state_change = o.on_state_change end
  if o.max_wait and o.max_wait ~= 0 then br.max_wait = o.max_wait end
  return br
end

-- The go (make_run) of object br's own options, direct or through the trampoline: shared
-- by the objects of one set of options. An object without functions shares it with
-- every such object (plain_runs); one made by fuse.new, with the objects of the same
-- options (its options record, br._opts); any other (fuse.wrap, an anonymous fuse.new
-- with functions) has its own.
local plain_runs = {}
local function shared_run(br, direct)
  local cfg, fallback, is_failure, listener = br.cfg, br.fallback, br.is_failure, br.on_state_change
  local slow, limit, max_wait = cfg.slow > 0, br._limit, br.max_wait or 0
  local runs
  if fallback == nil and is_failure == nil and listener == nil then runs = plain_runs
  elseif br._opts then
    runs = br._opts.runs
    if not runs then
      runs = {}
      br._opts.runs = runs
    end
  else
    return make_run(fallback, is_failure, listener, direct, slow, limit, max_wait)
  end
  local key = (direct and "d" or "t") .. (slow and "s" or "-") .. (limit and "l" or "-") .. max_wait
  local go = runs[key]
  if not go then
    go = make_run(fallback, is_failure, listener, direct, slow, limit, max_wait)
    runs[key] = go
  end
  return go
end

local function first_run(br)
  local go = shared_run(br, not TRAMPOLINE)
  br._run = go
  return go
end

-- The go of breaker br for fn: through the trampoline for a Lua function under LuaJIT,
-- else pcall'd directly (each found on first need); called as go(br, fn, ...).
local function run_for(br, fn)
  if not TRAMPOLINE or not is_direct(fn) then return br._run or first_run(br) end
  local go = br._run_direct
  if not go then
    go = shared_run(br, true)
    br._run_direct = go
  end
  return go
end

local check_callable = options.check_callable

-- What init_by_lua* changed in the shared registry, undone when nginx fails the reload
-- after it (and keeps the old workers): nginx then closes this Lua state, and the
-- finalizer of UNDO asks the core whether this state is still the master's newest
-- (fz_registry_undo: a reload that succeeds loads a newer one first; a worker's copy of
-- the state is not the master's). If so, the core gives back the registry the old
-- workers use when fuse.init mapped a new one (capacity, idle), and the breakers this
-- state reconfigured (RECONF: name, identity, options before and after) get their
-- options back, unless someone changed them since. EPOCH: this state's number.
local EPOCH = B.epoch()
local UNDO, RECONF = false, {}
local function undo_reload()
  if not B.undo(EPOCH) then return end
  for i = #RECONF, 1, -1 do
    local r = RECONF[i]
    local h, id = B.find(r.name)
    if h and id == r.id and #options.diff(B.config(h), r.new) == 0 then B.reconfigure(h, r.old) end
  end
end
local function undo_on_close()
  if UNDO then return end
  local newproxy = rawget(_G, "newproxy")
  if newproxy then
    UNDO = newproxy(true)
    getmetatable(UNDO).__gc = undo_reload
  else
    UNDO = setmetatable({}, { __gc = undo_reload })
  end
end

-- In nginx's init_by_lua* (the first start or a reload): a named breaker that exists
-- with other numeric options is reconfigured, not an error.
local function reloading()
  local ngx = rawget(_G, "ngx")
  return ngx and ngx.get_phase and ngx.get_phase() == "init"
end
_M._in_init = reloading  -- (fuse.upstream: a pool made in init_by_lua*)

local function ngx_notice(msg)
  local ngx = rawget(_G, "ngx")
  if ngx and ngx.log then ngx.log(ngx.NOTICE, msg) end
end

-- A breaker from validated options `o`; errors are raised at `level` (the user's call).
local function create(o, level)
  local h, st
  if o.name == nil then
    h, st = B.new(o.cfg)
    if not h then error("fuse: cannot create a breaker: " .. B.strerror(st), level + 1) end
    return make_breaker(h, 0, nil, o.cfg, o)
  end
  local id
  if fake then sync() end  -- creation may evict: idle is measured on fuse's clock
  h, st, id = B.open(o.name, o.cfg)
  if st == E_MISMATCH and reloading() then
    local before = B.config(h)
    local changed = concat(options.diff(before, o.cfg), ", ")
    RECONF[#RECONF + 1] = { name = o.name, id = id, old = before, new = o.cfg }
    undo_on_close()
    B.reconfigure(h, o.cfg)
    ngx_notice(("fuse: breaker '%s' reconfigured (old vs new): %s"):format(o.name, changed))
  elseif st == E_MISMATCH then
    error(("fuse: breaker '%s' already exists with other options (existing vs given): %s")
      :format(o.name, concat(options.diff(B.config(h), o.cfg), ", ")), level + 1)
  elseif not h then
    local extra = st == E_FULL and (" (capacity %d; raise it with fuse.init{ %scapacity = N })")
      :format(B.capacity(), B.is_shared() and "shared = true, " or "") or ""
    error(("fuse: cannot create breaker '%s': %s%s"):format(o.name, B.strerror(st), extra), level + 1)
  end
  -- equal options (status 0 or 1): the checked ones serve, no read back through the core
  return make_breaker(h, id, o.name, (st == 0 or st == 1) and o.cfg or B.config(h), o)
end

-- fuse.new of a name with the very options (same values, same functions) as the call
-- that made the name's object gives that object again while its breaker lives: a
-- gateway that asks for its breaker by name per request pays a table hit, an identity
-- check and a comparison of the options with constant keys, not a check of the options
-- nor a new object. The comparison reads each known option by its name and never hands
-- the options table to anything else, so a table made in the caller's loop, as in
-- fuse.new{ name = host, fails = 5 }, is never made under LuaJIT: the compiler sinks it
-- (spec/22-objects_spec.lua). Counting its keys (which finds an unknown one) would make
-- it escape: that is done at the name's creation and on one hit in CHECK_EVERY.
local news = objmaps.new(B)  -- (lua/fuse/objects.lua)

-- The count of a table's keys: LuaJIT's table.nkeys (compiled), elsewhere by hand.
local nkeys = (function()
  local ok, f = pcall(require, "table.nkeys")
  if ok then return f end
  return function(t)
    local n = 0
    for _ in pairs(t) do n = n + 1 end
    return n
  end
end)()

-- One hit in CHECK_EVERY also counts the options' keys, so that an unknown key at a
-- call site whose names were all made by another one is still raised. A prime: a
-- handler that calls fuse.new k times per request (k < 61) has every site checked.
local CHECK_EVERY = 61

-- The generated comparisons by the set of options present (its source is the same for
-- every record of that set): sames[sig](v1, ..., vn) -> function(a) that says whether
-- a holds v1 ... vn for those options and no value for every other known option but the
-- name. Generated, with the values as upvalues: no loop (a loop in a request handler's
-- trace is an inner loop that each call enters and leaves; a trace that starts at
-- fuse.new's entry and meets one aborts, and a dozen aborts blacklist fuse.new for the
-- life of the process) and no look-up by a key the compiler does not know.
local sames = {}

-- The comparison of options with the options copy (every known option but the name).
local function same_as(copy)
  local sig, vals, parts, args = {}, {}, {}, {}
  for _, k in ipairs(options.NAMES) do
    if k ~= "name" then
      if copy[k] == nil then
        parts[#parts + 1] = ("a[%q] == nil"):format(k)
      else
        local n = #sig + 1
        sig[n], vals[n], args[n] = k, copy[k], "v" .. n
        parts[#parts + 1] = ("a[%q] == v%d"):format(k, n)
      end
    end
  end
  local key = concat(sig, ",")
  local make = sames[key]
  if not make then
    local text = ("local %s = ...\nreturn function(a) return %s end")
      :format(#args > 0 and concat(args, ", ") or "_", concat(parts, " and "))
    make = assert((loadstring or load)(text, "=fuse.same_opts"))  -- luacheck: ignore 113
    sames[key] = make
  end
  return make(unpack(vals, 1, #sig))
end

-- The record of the options of a fuse.new call (copy: a copy of them, n: their count,
-- the name's value in it never read), shared by the objects made with the same options
-- but the name: same(a) says whether options a are those (every known option but the
-- name).
local function opts_record(copy, n)
  return { opts = copy, n = n, same = same_as(copy) }
end

-- same_known(a, b): whether options tables a and b hold the same value (or none) for
-- every known option but the name, compared one by one with no loop (generated from
-- options.NAMES). With the same count of keys, and b a copy of options that passed the
-- check (known keys only), a holds exactly b's options.
local same_known = (function()
  local parts = {}
  for _, k in ipairs(options.NAMES) do
    if k ~= "name" then parts[#parts + 1] = ("a[%q] == b[%q]"):format(k, k) end
  end
  local text = "return function(a, b) return " .. table.concat(parts, " and ") .. " end"
  return assert((loadstring or load)(text, "=fuse.same_known"))()  -- luacheck: ignore 113
end)()

-- The options last checked for a named breaker (a copy), and the check's result: a
-- gateway calls fuse.new with one set of options and many names, so only the name is
-- new and only the name needs a check.
local memo_opts, memo_n, memo_o, memo_shared

local function checked(opts, name)
  if memo_o and type(name) == "string" and #name >= 1 and #name <= 127 and not name:find("\0", 1, true) then
    if nkeys(opts) == memo_n and same_known(opts, memo_opts) then  -- no loop: see sames
      return { name = name, fallback = memo_o.fallback, is_failure = memo_o.is_failure,
        on_state_change = memo_o.on_state_change, max_wait = memo_o.max_wait, cfg = memo_o.cfg }
    end
  end
  local o = options.check(opts, 4)
  if o.name then
    memo_opts, memo_n, memo_o = {}, 0, o
    for k, v in pairs(opts) do memo_opts[k], memo_n = v, memo_n + 1 end
    memo_shared = opts_record(memo_opts, memo_n)
  end
  return o
end

local hits = 0

function _M.new(opts)
  local name = type(opts) == "table" and opts.name
  if type(name) == "string" then
    local br = news.map[name]
    local o = br and br._opts
    if o and o.same(opts) and B.id(br._h) == br._id then
      hits = hits + 1
      if hits < CHECK_EVERY then return br end
      hits = 0
      if nkeys(opts) == o.n then return br end
    end
  end
  local o = checked(opts, name)
  local br = create(o, 2)  -- not a tail call: create's errors name the caller's line
  if o.name then
    br._opts = memo_shared  -- checked() just made or matched it for these options
    news.put(o.name, br)
  end
  return br
end

-- fuse.wrap(fn, opts) -> guarded function, breaker
function _M.wrap(fn, opts)
  check_callable(fn, "fuse.wrap", 2)
  local o = options.check(opts, 3)
  local br = create(o, 2)
  local go = run_for(br, fn)
  return function(...) return go(br, fn, ...) end, br
end

-- Every method checks its self first: under LuaJIT a self that is not a breaker would
-- hand the core a NULL breaker (a crash pcall cannot catch). The usual cause is
-- b.method() for b:method(), which passes nil, or the first argument, as self. In a
-- trace the check is one compare of the metatable.
local function not_a_breaker(method, self)
  local got = self == nil and "nil" or type(self) == "table" and "a table" or "a " .. type(self)
  error(("fuse: call b:%s(), not b.%s(): self is %s, not a breaker"):format(method, method, got), 3)
end

function Breaker:call(fn, ...)
  if meta_of(self) ~= Breaker then not_a_breaker("call", self) end
  check_callable(fn, "call", 2)
  return run_for(self, fn)(self, fn, ...)
end

function Breaker:wrap(fn, fallback)
  if meta_of(self) ~= Breaker then not_a_breaker("wrap", self) end
  check_callable(fn, "wrap", 2)
  local go = run_for(self, fn)
  if fallback ~= nil then
    local cfg = self.cfg
    go = make_run(fallback, self.is_failure, self.on_state_change, not TRAMPOLINE or is_direct(fn),
      cfg.slow > 0, self._limit, self.max_wait or 0)
  end
  return function(...) return go(self, fn, ...) end
end

-- The two-step form: ticket = b:allow(); ... b:report(ticket, ok [, seconds]).
-- max_concurrent: the permits of allowed tickets not reported yet, key -> { handle,
-- pending list, entry, object, the core's ticket } (under OpenResty the key is noted
-- with its request, so that a request that ends without its report gives the permit
-- back in fuse.settle()). The key is what allow returned: the core's ticket when the
-- core tracked it (bit 7 set: unique while it is out, refused once reported), else a
-- stand-in, never issued again. Untracked tickets are not unique: the core leaves a
-- ticket untracked when the thread's ledger has no free entry near its cursor (thousands
-- of an nginx worker's tickets out at once), and untracked tickets of one state are
-- equal. Each call must have a key of its own: a report from another request or a timer
-- names no request, and the request whose permit it gives back must be the one whose
-- call it ended (else that request's end gives back the permit of a call still
-- running); and a report that comes after its request ended (fuse.settle() counted the
-- call) must find nothing, not a later call's permit.
local function held_of(br)
  local held = br._held
  if not held then
    held = {}
    br._held = held
  end
  return held
end

-- Stand-ins: -1, -2, ... (a number fz_done refuses at once, so that report resolves
-- one only after the core refused it: a report of a core ticket pays nothing for them).
local stand_ins = 0

local function stand_in()
  stand_ins = stand_ins + 1
  return -stand_ins
end

-- A permit of an allowed ticket given back (report).
local function give_held(br, key)
  local held = br._held
  local e = held and held[key]
  if not e then return end
  held[key] = nil
  if e[2] then untrack(e[2], e[3]) end
  core.fz_permit_give(e[1])
end

-- The end of a request whose allowed ticket (entry e, key) was never reported: its
-- permit back, and the call counted by the status as fuse.settle() counts calls that
-- ended their request.
local function settle_allowed(e, key, _, outcome)
  local br = e[4]
  local held = br._held
  if not (held and held[key] == e) then return end
  held[key] = nil
  core.fz_permit_give(e[1])
  if fake then sync() end
  local code = core.fz_done(br._h, e[5], outcome, -1)
  if code > 0 then fire(br.on_state_change, br.name, code) end
end

-- report's code for stand-in key of object br, which fz_done refused: fz_done's for the
-- ticket it stands for, and that ticket; E_REPORTED for a stand-in issued and not held
-- (reported, or another object's), E_TICKET for any other number.
local function report_stand_in(br, key, outcome, seconds)
  local e = br._held and br._held[key]
  if e then return core.fz_done(br._h, e[5], outcome, seconds), e[5] end
  if key == floor(key) and -key <= stand_ins then return E_REPORTED, key end
  return E_TICKET, key
end

function Breaker:allow()
  if meta_of(self) ~= Breaker then not_a_breaker("allow", self) end
  if fake then sync() end
  local limit, h, id, ph = self._limit, self._h, self._id, nil
  if limit then
    -- the permit of the breaker the ticket will be of: removed or evicted, its name's
    -- now (a permit of the retired one would count against no limit of this name)
    if id ~= 0 and B.id(h) ~= id then
      h, id = refind(self, id)
      if not h then return PASS_TICKET end  -- full registry: unguarded, counted nowhere
    end
    if permit(h, self.max_wait or 0) == 0 then return nil, rej_of(self, 4) end
    ph = h
  end
  local t = core.fz_allow_id(h, id)
  if t < 0 then  -- (one compare in a trace for an admitted call)
    while t == STALE do  -- again when another worker removed the name right after the re-find
      if limit then core.fz_permit_give(ph) end
      h, id = refind(self, id)
      if not h then return PASS_TICKET end  -- full registry: unguarded, counted nowhere
      if limit then
        if permit(h, self.max_wait or 0) == 0 then return nil, rej_of(self, 4) end
        ph = h
      end
      t = core.fz_allow_id(h, id)
    end
    if t < 0 then
      if limit then core.fz_permit_give(ph) end
      return nil, rejected(self, self.on_state_change, t)
    end
  end
  if t % 2 == 1 then fire(self.on_state_change, self.name, made_by(t)) end
  if limit then
    local held = held_of(self)
    local key = t  -- (untracked, or equal to a ticket out: a stand-in, see held_of)
    if t % 256 < 128 or held[t] then key = stand_in() end
    local e = { ph, false, false, self, t }
    if TRACK then e[2], e[3] = track(settle_allowed, e, key, 0, ph) end
    held[key] = e
    return key
  end
  return t
end

-- A ticket that object br's current breaker refused may be one an earlier breaker of its
-- name issued (before a removal or eviction found the name again): reported to the
-- handle that issued it, it counts nothing there (stale) and is not refused; or, when
-- an idle eviction retired that breaker while the call ran, it counts into the name's
-- breaker now (`late`).
function Breaker:report(ticket, ok, seconds)
  if meta_of(self) ~= Breaker then not_a_breaker("report", self) end
  if type(ticket) ~= "number" then error("fuse: report needs the ticket from allow, got " .. show(ticket), 2) end
  local outcome = ok == true and SUCCESS or ok == false and FAILURE or ok == nil and IGNORE
  if not outcome then error("fuse: report's ok must be true, false or nil, got " .. show(ok), 2) end
  if seconds ~= nil and not (type(seconds) == "number" and seconds >= 0 and seconds < huge) then
    error("fuse: report's seconds must be a finite number >= 0, got " .. show(seconds), 2)
  end
  if fake then
    if ticket == PASS_TICKET then return end  -- (as below: the clock is not read for it)
    sync()
  end
  local code = core.fz_done(self._h, ticket, outcome, seconds or -1)
  if code ~= 0 then  -- (0, the common case, is one compare in a trace)
    -- allow's answer when the registry was full counts nowhere: the core refuses it
    -- (E_TICKET: its key is 0, no breaker's), and it is no error
    if ticket == PASS_TICKET then return end
    local key = ticket  -- (what allow returned: held's key)
    if ticket < 0 then  -- allow's stand-in (max_concurrent): the ticket it stands for
      code, ticket = report_stand_in(self, key, outcome, seconds or -1)
      if code == 0 then return give_held(self, key) end
    end
    if code == E_STALE or (code == E_TICKET and self._was) then
      code = late(self, ticket, outcome, seconds or -1, code)
    end
    if code == E_REPORTED or code == E_TICKET then
      -- a ticket is an integer below 2^53: all its digits (show's 14 significant digits
      -- print one that ends in 0 as 3.7472087572493e+14)
      local shown = key == floor(key) and ("%.0f"):format(key) or show(key)
      if code == E_REPORTED then
        error("fuse: report: ticket " .. shown .. " was already reported"
          .. (key < 0 and ", or is another breaker's" or ""), 2)  -- (a stand-in: see held_of)
      end
      error("fuse: report: " .. shown .. " is not a ticket this breaker's allow issued"
        .. " (another breaker's, or made up)", 2)
    end
    give_held(self, key)
    fire(self.on_state_change, self.name, code)
    return
  end
  give_held(self, ticket)  -- (max_concurrent: the permit of an allowed ticket back)
end

function Breaker:state()
  if meta_of(self) ~= Breaker then not_a_breaker("state", self) end
  if fake then sync() end
  -- removed or evicted, and its name not there again: as the fresh breaker its next call
  -- would make (a read never creates one)
  local h = readable(self)
  if not h then return "closed" end
  local code = B.state(h)
  if code % 256 == REMOVED then  -- retired, its identity not moved yet: the name's breaker now
    h = readable(self, self._id)
    if not h then return "closed" end
    code = B.state(h)
  end
  fire(self.on_state_change, self.name, floor(code / 256))
  return STATES[code % 256]
end

function Breaker:stats()
  if meta_of(self) ~= Breaker then not_a_breaker("stats", self) end
  if fake then sync() end
  local s = {}
  -- gone, and its name not there again: the stats of a fresh breaker, never another's
  -- (a read never creates one)
  local h = readable(self) or B.new(self.cfg)
  local code = B.stats(h, s)
  if s.state == REMOVED then  -- retired, its identity not moved yet: the name's breaker now
    h = readable(self, self._id) or B.new(self.cfg)
    code = B.stats(h, s)
  end
  fire(self.on_state_change, self.name, code)
  s.state = STATES[s.state]
  s.calls_total = s.successes_total + s.failures_total
  return s
end

-- fuse._failures(b): the failures in b's window, without a stats table (fuse.upstream
-- reads it for each untried peer of a retry); 0 for a breaker gone with its name.
function _M._failures(br)
  if fake then sync() end
  local h = readable(br)
  return h and B.failures(h) or 0
end

local function manual(method)
  local act = B[method .. "_id"]
  return function(self)
    if meta_of(self) ~= Breaker then not_a_breaker(method, self) end
    if fake then sync() end
    local code = manual_act(self, act)
    if code then fire(self.on_state_change, self.name, code) end
  end
end

Breaker.reset = manual("reset")

-- b:force_open([seconds]): forced_open until reset, or for `seconds`, then probes decide.
local MAX_FORCE_OPEN = 2764800
function Breaker:force_open(seconds)
  if meta_of(self) ~= Breaker then not_a_breaker("force_open", self) end
  if seconds ~= nil and (type(seconds) ~= "number" or not (seconds > 0 and seconds <= MAX_FORCE_OPEN)) then
    error("fuse: force_open's seconds must be a number in (0, " .. MAX_FORCE_OPEN .. "], got "
      .. show(seconds), 2)
  end
  if fake then sync() end
  local code
  if seconds == nil then code = manual_act(self, B.force_open_id)
  else code = manual_act(self, B.force_open_for_id, seconds) end
  if code then fire(self.on_state_change, self.name, code) end
end
Breaker.disable = manual("disable")

---------------------------------------------------------------------------- the registry

-- fuse.get returns one object per live breaker (its options are the breaker's), kept
-- by name (fuse.objects, as news above): a lookup is a table hit and an identity check.
local got = objmaps.new(B)

local NO_FUNCTIONS = {}

local function get(name)
  local br = got.map[name]
  if br and B.id(br._h) == br._id then return br end
  if type(name) ~= "string" then error("fuse: fuse.get needs a name string, got " .. show(name), 2) end
  if #name == 0 then return nil end
  local h, id = B.find(name)
  if not h then return nil end
  local cfg = B.config(h)
  -- the slot passed to another breaker meanwhile: those options are not this name's
  if B.id(h) ~= id then return get(name) end
  br = make_breaker(h, id, name, cfg, NO_FUNCTIONS)
  got.put(name, br)
  return br
end
_M.get = get

-- fuse.remove(name) -> true when a breaker of that name existed and is now gone.
function _M.remove(name)
  if type(name) ~= "string" then error("fuse: fuse.remove needs a name string, got " .. show(name), 2) end
  return #name > 0 and #name <= 127 and not name:find("\0", 1, true) and B.remove(name) or false
end

-- fn(h, name, id) for the live breaker of each registry slot from `from` (0) up to `upto`
-- (excluded; the slots handed out so far), where id is the breaker's identity read
-- before its name: B.id(h) == id says whether that breaker is still the slot's (one
-- removed or reused meanwhile is not). fn returning true stops the walk. Returns the
-- slot after the last one looked at. (No closure per slot: making one (FNEW) is a
-- bytecode LuaJIT does not compile; every trace of the walk aborted, and LuaJIT
-- blacklisted the loop. 100,000 slots are walked at every fuse.metrics().)
local function each_breaker(fn, from, upto)
  local i, n = from or 0, upto or B.count()
  while i < n do
    local h = B.at(i)
    local id = h and B.id(h)
    i = i + 1
    if h then
      if fn(h, B.name_of(h), id) then break end
    end
  end
  return i
end

-- (one page of every slot: a name removed and made again in a later slot during the
-- walk, by another worker, is listed once, as fuse.metrics shows it once)
function _M.list()
  return (_M._page(0, huge, huge, function(name) return name end))
end

-- Internal, for fuse.admin and fuse.list: one page of a walk over the registry, in slot
-- order. From slot `from` (0 at first), looking at `budget` slots at most, calls
-- fn(name) for each live breaker and lists what it returns (nil: nothing) until `limit`
-- are listed.
-- Returns the list and the slot the next page starts from, or nil when the walk is
-- over. A breaker that lives through the whole walk is seen once (slots do not move);
-- one made or removed meanwhile may be seen or not, once per name and page.
function _M._page(from, limit, budget, fn)
  local list, seen, count = {}, {}, B.count()
  local upto = math.min(count, from + budget)
  local i = each_breaker(function(h, name, id)
    if B.id(h) == id and not seen[name] then
      seen[name] = true
      local v = fn(name)
      if v ~= nil then list[#list + 1] = v end
    end
    return #list >= limit
  end, from, upto)
  if i < count then return list, i end
  return list, nil
end

-- fuse.init{ capacity = N [, shared = true] [, idle = seconds] }: before any named
-- breaker exists (shared: in nginx's init_by_lua*, before the fork; a reload may change
-- capacity and idle).
function _M.init(opts)
  local o = options.check_init(opts, 3)
  local ngx = rawget(_G, "ngx")
  local phase = ngx and ngx.get_phase and ngx.get_phase()
  if o.shared and phase and phase ~= "init" then
    error("fuse: fuse.init{ shared = true } belongs in init_by_lua*, before nginx forks its "
      .. "workers; in " .. phase .. " each worker would get a registry of its own", 2)
  end
  local rc = B.init(o.capacity, o.shared, o.idle)
  if rc == 0 then  -- the registry may be another now: objects of the one before go
    got.reset()
    news.reset()
  end
  if rc == 0 and o.shared then rc = B.events_init_shared() end  -- fuse.events: one ring for every worker
  if rc == 0 and o.shared and phase == "init" then undo_on_close() end
  if rc ~= 0 then
    local why = rc == -6 and ((o.shared and B.is_shared()) and ("it is already shared with capacity "
      .. B.capacity()) or "named breakers exist already: call fuse.init first"
      .. (o.shared and ", in init_by_lua" or "")) or B.strerror(rc)
    error("fuse: fuse.init cannot " .. (o.shared and "share" or "size") .. " the registry: " .. why, 2)
  end
  return true
end

---------------------------------------------------------------------------- events

-- fuse.events([since]): the recorded transitions (lua/fuse/events.lua).
_M.events = require("fuse.events").new(B, STATES)


---------------------------------------------------------------------------- OpenResty: calls that end the request

-- fuse.settle() in nginx's log phase, and fuse.log() its old name (lua/fuse/settle.lua).
local settle = require "fuse.settle"
_M.settle, _M.log = settle.settle, settle.log

---------------------------------------------------------------------------- metrics and shared counters

-- fuse.metrics(), and the shared counters fuse.upstream keeps (lua/fuse/metrics.lua).
local metrics = require("fuse.metrics").new(B, each_breaker, function() if fake then sync() end end)
_M.metrics = metrics.metrics
-- fuse.metrics_chunks(fn): fuse.metrics()' text handed to fn in parts, in order (under
-- OpenResty: fn = ngx.print sends a scrape without making it one string first).
function _M.metrics_chunks(fn)
  check_callable(fn, "metrics_chunks", 2)
  return metrics.metrics_chunks(fn)
end
_M._counter, _M._count = metrics.counter, metrics.count
-- fuse._counter_value(i): under LuaJIT the core's function itself, which fuse.upstream
-- calls at every pick: one call into C in its trace, no Lua function in between.
_M._counter_value = B.counter_value_c or metrics.counter_value
-- fuse._counter_word(i): under LuaJIT the counter's word (a uint64_t pointer), which
-- fuse.upstream reads at every pick with one load; nil under the C module.
_M._counter_word = B.counter_word

---------------------------------------------------------------------------- OpenResty helpers

-- fuse.admin, fuse.reject and fuse.watch are lua/fuse/admin.lua's functions themselves,
-- whose errors name their caller's line. (Wrappers that tail-called them left Lua 5.1 a
-- frame without a line, which those errors named.) fuse.admin requires "fuse", so this
-- module is in package.loaded first, as module() put it there.
if type(package.loaded.fuse) ~= "table" then package.loaded.fuse = _M end
do
  local admin = require "fuse.admin"
  _M.admin, _M.reject, _M.watch = admin.admin, admin.reject, admin.watch
end

return _M
