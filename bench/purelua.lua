-- bench/purelua.lua -- a plain-Lua circuit breaker, the baseline fuse is compared against.
--
-- It is written the way a competent Lua developer would write one for a single Lua state,
-- with the semantics of fuse's default rule:
--
--   * closed: `fails` failures inside a sliding window of `window` seconds open the circuit.
--     The window is 10 buckets of window/10 seconds plus the current, partial bucket, so a
--     failure counts for at least `window` and at most `window * 1.1` seconds (as in fuse).
--   * open: every call is rejected for `open_for` seconds (checked lazily on the next call).
--   * half-open: up to `probes` calls are let through at once; `probes` successes close the
--     circuit (fresh window), one failure opens it again.
--   * a failure is a raised error, or a `nil, err` result (first nil, second not nil).
--   * every transition bumps a generation; an outcome from an earlier one is ignored.
--   * not there (a baseline needs none of it): probe_timeout, rate rules, backoff, sharing
--     across threads or processes; a fallback called for a failure gets the error only.
--
-- It is not deliberately slow: a success in the closed state reads no clock and allocates
-- nothing (the window only counts failures), results go back through a varargs helper, and
-- the rejection object is reused per breaker (as fuse is allowed to).
--
-- Clock: `opts.clock`, a function returning seconds. Default: ngx.now under OpenResty (cached
-- by nginx, nearly free); else, under LuaJIT, clock_gettime(CLOCK_MONOTONIC) through the FFI;
-- else os.time (1 s resolution). os.clock is not used: it is CPU time, not wall time, and
-- costs a system call (~650 ns here). bench/bench.lua passes CLOCK_MONOTONIC_COARSE through
-- the FFI, the clock fuse's core reads, so both sides pay the same for time.
--
--   local purelua = require "purelua"   -- with bench/?.lua on LUA_PATH
--   local g, b = purelua.wrap(fn, {fails = 5, window = 10, open_for = 10, fallback = fb})

local M = {}

local CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
local NBUCKETS = 10

local floor, select, pcall, error, type = math.floor, select, pcall, error, type

local function default_clock()
  local ngx = rawget(_G, "ngx")
  if ngx and ngx.now then return ngx.now end
  local ok, ffi = pcall(require, "ffi")
  if ok then
    pcall(ffi.cdef, [[
      typedef struct { long tv_sec; long tv_nsec; } purelua_timespec;
      int purelua_clock_gettime(int clk, purelua_timespec *tp) __asm__("clock_gettime");
    ]])
    local ts, C = ffi.new("purelua_timespec"), ffi.C
    return function()
      C.purelua_clock_gettime(1, ts)  -- CLOCK_MONOTONIC
      return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
    end
  end
  return os.time
end

local rejection_mt = {
  __tostring = function(r) return "purelua: circuit '" .. (r.name or "anonymous") .. "' is open" end,
}

local Breaker = {}
Breaker.__index = Breaker

function M.new(opts)
  opts = opts or {}
  local window = opts.window or 10
  local b = setmetatable({
    name = opts.name,
    fails = opts.fails or 5,
    open_for = opts.open_for or window,
    probes = opts.probes or 1,
    width = window / NBUCKETS,          -- seconds per bucket
    clock = opts.clock or default_clock(),
    fallback = opts.fallback,
    on_state_change = opts.on_state_change,
    state = CLOSED,
    gen = 0,
    -- closed: ring of NBUCKETS + 1 failure counts; `epoch` is the bucket number of the
    -- newest slot, `failures` the sum of the ring
    ring = {}, epoch = 0, failures = 0,
    -- open: when probes are admitted; half-open: probes in flight and successes so far
    until_t = 0, inflight = 0, successes = 0,
  }, Breaker)
  for i = 0, NBUCKETS do b.ring[i] = 0 end
  b.rejection = setmetatable({ name = b.name, state = OPEN, retry_after = 0 }, rejection_mt)
  return b
end

function M.is_rejection(v)
  return type(v) == "table" and getmetatable(v) == rejection_mt
end

local function transition(b, to, now)
  local from = b.state
  b.state, b.gen = to, b.gen + 1
  if to == OPEN then
    b.until_t = now + b.open_for
  elseif to == HALF_OPEN then
    b.inflight, b.successes = 0, 0
  else -- CLOSED: a fresh window
    local ring = b.ring
    for i = 0, NBUCKETS do ring[i] = 0 end
    b.failures = 0
  end
  local cb = b.on_state_change
  if cb then pcall(cb, b.name, from, to) end
end

-- Counts one failure in the closed window; returns true when it trips the circuit.
local function count_failure(b, now)
  local e, ring = floor(now / b.width), b.ring
  local d = e - b.epoch
  if d > 0 then                        -- slide: clear the buckets that fell out
    if d > NBUCKETS then d = NBUCKETS + 1 end
    for k = 1, d do
      local i = (b.epoch + k) % (NBUCKETS + 1)
      b.failures = b.failures - ring[i]
      ring[i] = 0
    end
    b.epoch = e
  end
  local i = b.epoch % (NBUCKETS + 1)
  ring[i] = ring[i] + 1
  b.failures = b.failures + 1
  return b.failures >= b.fails
end

-- Asks to make a call: returns the generation it runs in, or nil when it is rejected.
function Breaker:enter()
  local st = self.state
  if st == CLOSED then return self.gen end
  local now = self.clock()
  if st == OPEN then
    if now < self.until_t then return nil end
    transition(self, HALF_OPEN, now)
  end
  if self.inflight >= self.probes then return nil end
  self.inflight = self.inflight + 1
  return self.gen
end

-- Records the outcome of a call admitted in generation `gen`.
function Breaker:done(gen, ok)
  if gen ~= self.gen then return end
  local st = self.state
  if st == CLOSED then
    if not ok then
      local now = self.clock()
      if count_failure(self, now) then transition(self, OPEN, now) end
    end
  elseif st == HALF_OPEN then
    self.inflight = self.inflight - 1
    if not ok then
      transition(self, OPEN, self.clock())
    else
      self.successes = self.successes + 1
      if self.successes >= self.probes then transition(self, CLOSED) end
    end
  end
end

function Breaker:reject(...)
  local r = self.rejection
  r.state = self.state
  local left = self.state == OPEN and self.until_t - self.clock() or 0
  r.retry_after = left > 0 and left or 0
  local fb = self.fallback
  if fb == nil then return nil, r end
  if type(fb) == "function" then return fb(r, ...) end
  return fb
end

local function finish(b, gen, fb, ok, ...)
  if ok then
    if (...) == nil and select("#", ...) > 1 and select(2, ...) ~= nil then
      b:done(gen, false)
      if fb ~= nil then
        if type(fb) == "function" then return fb(select(2, ...)) end
        return fb
      end
    else
      b:done(gen, true)
    end
    return ...
  end
  b:done(gen, false)
  if fb ~= nil then
    if type(fb) == "function" then return fb((...)) end
    return fb
  end
  error((...), 0)
end

-- A guarded function over this breaker. The fallback gets (err_or_rejection, ...args)
-- for rejections; for failures it gets the error only (args are not kept, to keep the
-- success path free of allocation).
function Breaker:wrap(fn, fallback)
  local b = self
  local fb = fallback
  if fb == nil then fb = b.fallback end
  return function(...)
    local gen = b:enter()
    if gen == nil then return b:reject(...) end
    return finish(b, gen, fb, pcall(fn, ...))
  end
end

function M.wrap(fn, opts)
  local b = M.new(opts)
  return b:wrap(fn), b
end

return M
