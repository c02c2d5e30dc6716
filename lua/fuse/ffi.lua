-- fuse.ffi: the LuaJIT FFI backend. Thin: every function is one call into the core
-- (csrc/fz_state.c and the rest of csrc/); the facade (fuse.lua) validates and holds the logic.
local ffi = require "ffi"
local cdef = require "fuse.cdef"

local tonumber = tonumber

local function find_library()
  local path, tried = package.searchpath("fuse.core", package.cpath)
  if not path then
    error("fuse: cannot find the core library (fuse/core.so) on package.cpath;" .. tried, 3)
  end
  return path
end

-- Declared once per VM: a second `require "fuse"` (package.loaded cleared for a code
-- reload, or a vendored second copy) finds the declarations in place, and ffi.cdef
-- cannot redefine them.
if not pcall(ffi.typeof, "fz_config") then ffi.cdef(cdef.cdef) end
local C = ffi.load(find_library())

if C.fz_abi_version() ~= cdef.abi then
  error(string.format("fuse: core library ABI %d does not match lua/fuse/cdef.lua (ABI %d): rebuild",
    C.fz_abi_version(), cdef.abi), 2)
end

-- `lib`: the core's namespace itself. The facade calls the functions of the guarded-call
-- path (fz_enter, fz_done, the clock) through it, with no Lua function in between: LuaJIT
-- starts traces at the entries of small functions that interpreted code calls often, and
-- blacklists an entry whose traces keep aborting (a one-line `return C.fz_enter(h)` is
-- one: a tail call into C from a trace's first frame aborts); every guarded call would
-- then run interpreted for the rest of the process.
local _M = { name = "ffi", lib = C }

local status = ffi.new("int[1]")
local idbuf = ffi.new("uint32_t[1]")
local cfg_buf = ffi.new("fz_config")
local stats_buf = ffi.new("fz_stats")

-- Field by field, each name a constant: a loop over the names would index the struct by
-- a variable key, which LuaJIT does not compile (and interprets at ~0.1 us a field), on
-- the path of every creation and every first lookup of a name.
local function to_config(cfg)
  local c = cfg_buf
  c.window, c.open_for, c.max_open_for, c.slow = cfg.window, cfg.open_for, cfg.max_open_for, cfg.slow
  c.probe_timeout, c.failure_rate, c.slow_rate = cfg.probe_timeout, cfg.failure_rate, cfg.slow_rate
  c.backoff, c.jitter, c.fails, c.count_window = cfg.backoff, cfg.jitter, cfg.fails, cfg.count_window
  c.min_calls, c.probes, c.max_concurrent = cfg.min_calls, cfg.probes, cfg.max_concurrent
  return c
end

local function from_config(c)
  return { window = c.window, open_for = c.open_for, max_open_for = c.max_open_for, slow = c.slow,
    probe_timeout = c.probe_timeout, failure_rate = c.failure_rate, slow_rate = c.slow_rate,
    backoff = c.backoff, jitter = c.jitter, fails = tonumber(c.fails),
    count_window = tonumber(c.count_window), min_calls = tonumber(c.min_calls), probes = tonumber(c.probes),
    max_concurrent = tonumber(c.max_concurrent) }
end

function _M.strerror(code) return ffi.string(C.fz_strerror(code)) end

-- An anonymous breaker, freed when the returned handle is collected.
function _M.new(cfg)
  local h = C.fz_breaker_new(to_config(cfg), status)
  if h == nil then return nil, status[0] end
  return ffi.gc(h, C.fz_breaker_free)
end

-- The registry breaker `name`, its status as fz_registry_open's, and its identity.
function _M.open(name, cfg)
  local h = C.fz_registry_open_id(name, #name, to_config(cfg), status, idbuf)
  if h == nil then return nil, status[0] end
  return h, status[0], tonumber(idbuf[0])
end

-- The registry breaker `name` and its identity, or nil.
function _M.find(name)
  local h = C.fz_registry_find_id(name, #name, idbuf)
  if h == nil then return nil end
  return h, tonumber(idbuf[0])
end

function _M.remove(name) return C.fz_registry_remove(name, #name) == 1 end
function _M.id(h) return (C.fz_breaker_id(h)) end  -- (a uint32_t: a number already)
function _M.reconfigure(h, cfg) return (C.fz_breaker_reconfigure(h, to_config(cfg))) end
function _M.live() return (C.fz_registry_live()) end

function _M.count() return (C.fz_registry_count()) end

function _M.at(i)
  local h = C.fz_registry_at(i)
  if h == nil then return nil end
  return h
end

-- (parenthesized: a tail call of ffi.string aborts a trace that begins here)
function _M.name_of(h) return (ffi.string(C.fz_breaker_name(h))) end

function _M.config(h)
  C.fz_breaker_config(h, cfg_buf)
  return from_config(cfg_buf)
end

-- The guarded-call path (fz_enter, fz_done) goes through `lib`, not through functions
-- here. The results below are parenthesized: `return (C.f(x))` is a call and a return,
-- never a tail call into C, which a trace starting at the function's entry cannot record.
function _M.state(h) return (C.fz_state(h)) end
function _M.retry_after(h) return (C.fz_retry_after(h)) end

local function fill(t)
  local s = stats_buf
  t.state, t.calls, t.failures, t.slow = s.state, s.calls, s.failures, s.slow
  t.rejections, t.failure_rate, t.slow_rate = s.rejections, s.failure_rate, s.slow_rate
  t.retry_after = s.retry_after
  t.successes_total, t.failures_total = tonumber(s.successes_total), tonumber(s.failures_total)
  t.slow_total, t.rejections_total = tonumber(s.slow_total), tonumber(s.rejections_total)
  t.opens_total = tonumber(s.opens_total)
  t.running, t.full_total = s.running, tonumber(s.full_total)
end

-- Fills `t` with the numbers of fz_stats; returns the transition code.
function _M.stats(h, t)
  local made = C.fz_stats_read(h, stats_buf)
  fill(t)
  return made
end

-- As stats, without making any transition (the state reported is the one it would give).
function _M.peek(h, t)
  C.fz_stats_peek(h, stats_buf)
  fill(t)
end

-- The failures in the window, as peek reads them (no table).
function _M.failures(h)
  C.fz_stats_peek(h, stats_buf)
  return stats_buf.failures
end

function _M.init_shared(capacity) return (C.fz_registry_init_shared(capacity)) end
function _M.init(capacity, shared, idle) return (C.fz_registry_init(capacity, shared and 1 or 0, idle)) end
function _M.epoch() return tonumber(C.fz_registry_epoch()) end
function _M.undo(epoch) return C.fz_registry_undo(epoch) == 1 end
function _M.idle() return (C.fz_registry_idle()) end
function _M.full_add() C.fz_registry_full_add() end
function _M.full_total() return (C.fz_registry_full_total()) end
function _M.evictions_total() return (C.fz_registry_evictions_total()) end
function _M.is_shared() return C.fz_registry_is_shared() ~= 0 end
function _M.capacity() return tonumber(C.fz_registry_capacity()) end

-- Manual states through a handle of identity id: FZ_ESTALE (-10) when its breaker is gone.
function _M.reset_id(h, id) return (C.fz_reset_id(h, id)) end
function _M.force_open_id(h, id) return (C.fz_force_open_id(h, id)) end
function _M.disable_id(h, id) return (C.fz_disable_id(h, id)) end
function _M.force_open_for_id(h, id, seconds) return (C.fz_force_open_for_id(h, id, seconds)) end
-- The outcome of a call whose breaker was evicted while it ran, into the name's breaker now.
function _M.late_id(h, id, outcome, elapsed) return (C.fz_late_id(h, id, outcome, elapsed)) end

-- The transition events ring (as fz_lua.c's functions of the same names).
local event_buf = ffi.new("fz_event")
function _M.events_init_shared() return C.fz_events_init_shared() end
function _M.event(name, from, to) return C.fz_events_add(name, #name, from, to) end
function _M.events_last() return C.fz_events_last() end
function _M.event_at(seq)
  local rc = C.fz_events_read(seq, event_buf)
  if rc ~= 1 then return rc end
  local e = event_buf
  return 1, e.seq, e.time, ffi.string(e.name), e.from, e.to, e.pid
end

function _M.clock_manual(s) C.fz_clock_manual(s) end
function _M.clock_auto() C.fz_clock_auto() end
function _M.clock_now() return (C.fz_clock_now()) end

-- The core's option bounds (fz_config_bound), in fz_config order.
function _M.bounds()
  local list = {}
  local i = 0
  while true do
    local b = C.fz_config_bound(i)
    if b == nil then return list end
    i = i + 1
    list[i] = { name = ffi.string(b.name), lo = b.lo, hi = b.hi, lo_open = b.lo_open ~= 0,
      hi_open = b.hi_open ~= 0, integer = b.integer ~= 0, zero_off = b.zero_off ~= 0 }
  end
end

-- Shared counters (csrc/fz_counters.c).
_M.counters_max = C.FZ_COUNTERS_MAX
function _M.counter_open(name) return C.fz_counter_open(name, #name) end
function _M.counter_add(i, n) C.fz_counter_add(i, n) end
function _M.counter_value(i) return C.fz_counter_value(i) end
_M.counter_value_c = C.fz_counter_value  -- (the C function itself, for fuse._counter_value)
function _M.counter_word(i)  -- the counter's word, for fuse._counter_word
  local w = C.fz_counter_word(i)
  if w == nil then return nil end
  return w
end
function _M.counter_name(i)
  local s = C.fz_counter_name(i)
  if s == nil then return nil end
  return ffi.string(s)
end

return _M
