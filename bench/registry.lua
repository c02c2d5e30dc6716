-- bench/registry.lua -- the registry at 100, 10,000 and 100,000 names, under LuaJIT.
--
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" luajit bench/registry.lua
--
-- One process, fuse.init{ capacity = 131072 }. Only the public API and the backend's
-- B.find / B.open (there since the registry exists), so that the same file measures an
-- older tree side by side (bench/README.md, "The registry").
--
-- At each size it times, in ns per lookup (median of 7 rounds of 200,000; a row that
-- makes a fresh options table per call: of enough calls to allocate twice the heap, so
-- that each round pays the collector's whole cycles), over names spread over the whole
-- registry:
--   fuse.get, hot               1,000 names, cycled: in the facade's cache of recent names
--   fuse.get, any name          every name registered, cycled (at 10,000 and 100,000: more
--                               names than that cache holds, so each lookup misses it)
--   core find                   fz_registry_find_id through the FFI (the hash index alone),
--                               over the hot 1,000
--   fuse.new existing, hot      fuse.new{ name = n, fails = 5 } of the hot 1,000
--   fuse.new existing, any      the same over every name
--   ..., one opts table         the same with one options table whose name changes: no
--                               garbage per call, so no collector work that the retained
--                               heap makes dearer (what the row above adds to it)
--   a fresh options table alone  the same table { name = n, fails = 5 } made and handed
--                               to table.nkeys (which keeps the JIT from sinking it), no
--                               fuse call: what the caller's table costs when it is made
--                               (its allocation and its collection at this heap); since
--                               fuse.new compares the options by constant keys, the JIT
--                               sinks the table of "fuse.new existing" (it is made on one
--                               call in 61, for the count of its keys)
-- Growing the registry to each size times creation over its last 10%: half through
-- fuse.new, half through the core alone (B.open), with the resident set's growth
-- (/proc/self/statm) per breaker over each half (the core's: the registry's share; the
-- Lua heap may reuse pages it freed, so the Lua objects are measured apart, at the end).
-- Then, once each: the first fuse.get, and the first fuse.new, in this process of a name
-- that exists (made through the core, so no object of it exists yet).
local ffi = require "ffi"
local table_new = require "table.new"
local fuse = require "fuse"
local B = require "fuse.ffi"

ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } breg_timespec;
  int breg_clock_gettime(int clk, breg_timespec *tp) __asm__("clock_gettime");
]]
local ts = ffi.new("breg_timespec")
local function now()
  ffi.C.breg_clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local function rss_bytes()
  local f = assert(io.open("/proc/self/statm"))
  local pages = tonumber(f:read("*l"):match("^%d+%s+(%d+)"))
  f:close()
  return pages * 4096
end

local function load1()
  local f = io.open("/proc/loadavg")
  local s = f and f:read("*l") or "?"
  if f then f:close() end
  return s:match("^(%S+)")
end

fuse.init{ capacity = 131072 }

local function name(i) return "bench.registry.host-" .. i .. ".example.com" end
local function ok() return true end
local nkeys = require "table.nkeys"  -- (OpenResty's LuaJIT, as table.new above)

local made = 0
local CFG = B.config(fuse.new{ fails = 5 }._h)  -- the options fuse.new{ fails = 5 } gives
local kept = {}  -- the objects of the timed fuse.new creations, alive to the end
local first_get, first_new = {}, {}  -- names made through the core, no object yet

-- Grows the registry to n names, the last 10% timed (see the header).
local function grow_to(n)
  local first = made + 1
  local tail = math.max(first, n - math.floor(n / 10) + 1)
  local mid = tail + math.floor((n - tail + 1) / 2)
  for i = first, tail - 1 do fuse.new{ name = name(i), fails = 5 } end
  local objs = table_new(mid - tail, 0)
  collectgarbage()
  collectgarbage()
  local rss0, t0 = rss_bytes(), now()
  for i = tail, mid - 1 do objs[#objs + 1] = fuse.new{ name = name(i), fails = 5 } end
  local t1 = now()
  collectgarbage()
  collectgarbage()
  local rss1 = rss_bytes()
  local t2 = now()
  for i = mid, n do B.open(name(i), CFG) end
  local t3 = now()
  local rss2 = rss_bytes()
  for _, b in ipairs(objs) do kept[#kept + 1] = b end
  first_get, first_new = {}, {}
  for i = mid, n do
    local set = (i - mid) % 2 == 0 and first_get or first_new
    set[#set + 1] = name(i)
  end
  made = n
  local news = mid - tail
  return { rate_new = news / (t1 - t0), rate_core = (n - mid + 1) / (t3 - t2),
    rss_new = (rss1 - rss0) / news, rss_core = (rss2 - rss1) / (n - mid + 1) }
end

local ROUNDS, N, HOT = 7, 200000, 1000

local function median(xs)
  table.sort(xs)
  return xs[math.ceil(#xs / 2)]
end

-- Each loop its own function (its own trace). loop(names, m, n): n calls over names[1..m].
local function make_loops()
  return {
    get = function(names, m, n)
      local get, s = fuse.get, 0
      for i = 1, n do if get(names[i % m + 1]) then s = s + 1 end end
      assert(s == n)
    end,
    find = function(names, m, n)
      local find, s = B.find, 0
      for i = 1, n do if find(names[i % m + 1]) then s = s + 1 end end
      assert(s == n)
    end,
    new = function(names, m, n)
      local new, s = fuse.new, 0
      for i = 1, n do if new{ name = names[i % m + 1], fails = 5 } then s = s + 1 end end
      assert(s == n)
    end,
    bare = function(names, m, n)
      local s = 0
      for i = 1, n do if nkeys{ name = names[i % m + 1], fails = 5 } == 2 then s = s + 1 end end
      assert(s == n)
    end,
    new_reused = function(names, m, n)
      local new, s, opts = fuse.new, 0, { fails = 5 }
      for i = 1, n do
        opts.name = names[i % m + 1]
        if new(opts) then s = s + 1 end
      end
      assert(s == n)
    end,
  }
end

-- ns per call of loop over `count` names spread over the n registered, median of ROUNDS
local function time_lookup(kind, n, count, per_round)
  local names = {}
  for i = 1, count do names[i] = name(1 + math.floor((i - 1) * n / count)) end
  local loop = make_loops()[kind]
  loop(names, count, 3 * count)  -- warm-up: every name 3 times
  local r = {}
  for k = 1, ROUNDS do
    local t0 = now()
    loop(names, count, per_round)
    r[k] = (now() - t0) / per_round * 1e9
  end
  return median(r)
end

-- ns per call of one pass of `kind` over names nobody looked up in this process yet
local function time_first(kind, names)
  local loop = make_loops()[kind]
  local t0 = now()
  loop(names, #names, #names)
  return (now() - t0) / #names * 1e9
end

-- Calls per round for a loop that makes a fresh options table per call (112 bytes of
-- garbage): enough to allocate twice the heap, so that every round pays whole collector
-- cycles (with the default pause a cycle starts each time the heap doubles; shorter
-- rounds would be timed with no collection in them, or with one, by chance).
local function garbage_round()
  return math.max(N / 2, math.ceil(2 * collectgarbage("count") * 1024 / 112))
end

local ROWS = {
  -- (first: the rows over every name make the objects of every name)
  { "fuse.get, first in this process", function() return time_first("get", first_get) end },
  { "fuse.new, first in this process", function() return time_first("new", first_new) end },
  { "fuse.get, hot (1,000 names)", function(n) return time_lookup("get", n, math.min(n, HOT), N) end },
  { "fuse.get, any name", function(n) return time_lookup("get", n, n, N) end },
  { "core find, hot (hash index)", function(n) return time_lookup("find", n, math.min(n, HOT), N) end },
  { "fuse.new existing, hot", function(n) return time_lookup("new", n, math.min(n, HOT), garbage_round()) end },
  { "fuse.new existing, any name", function(n) return time_lookup("new", n, n, garbage_round()) end },
  { "fuse.new existing, any, one opts table", function(n) return time_lookup("new_reused", n, n, N / 2) end },
  { "a fresh options table alone", function(n) return time_lookup("bare", n, n, garbage_round()) end },
}

local SIZES = { 100, 10000, 100000 }
local rows = {}
local load0 = load1()
for _, size in ipairs(SIZES) do
  local row = grow_to(size)
  row.size = size
  for _, l in ipairs(ROWS) do row[l[1]] = l[2](size) end
  rows[#rows + 1] = row
end

print(("registry: %s, capacity 131072, load %s to %s"):format(jit.version, load0, load1()))
io.write(("%-40s"):format("ns per lookup, names registered:"))
for _, r in ipairs(rows) do io.write(("%12d"):format(r.size)) end
io.write("   100k/100\n")
for _, l in ipairs(ROWS) do
  io.write(("%-40s"):format(l[1]))
  for _, r in ipairs(rows) do io.write(("%12.1f"):format(r[l[1]])) end
  io.write(("%9.2fx\n"):format(rows[#rows][l[1]] / rows[1][l[1]]))
end
local function line(label, key, fmt)
  io.write(("%-40s"):format(label))
  for _, r in ipairs(rows) do io.write((fmt or "%12.0f"):format(r[key])) end
  io.write("\n")
end
line("creations/s, fuse.new (last 5%)", "rate_new")
line("creations/s, core (last 5%)", "rate_core")
line("resident bytes/breaker, core alone", "rss_core")
line("resident bytes/breaker, fuse.new", "rss_new")
assert(#kept > 0)

-- The Lua heap an object costs: 20,000 more names made through fuse.new, their objects
-- kept, then one guarded call through each (collectgarbage "count" after full
-- collections; the names themselves made before).
local M = 20000
local fresh, objs = {}, table_new(M, 0)
for i = 1, M do fresh[i], objs[i] = "bench.registry.heap-" .. i, false end
local function heap()
  collectgarbage()
  collectgarbage()
  return collectgarbage("count") * 1024
end
local h0 = heap()
for i = 1, M do objs[i] = fuse.new{ name = fresh[i], fails = 5 } end
local h1 = heap()
for i = 1, M do objs[i]:call(ok) end
local h2 = heap()
print(("Lua heap bytes per object: %.0f as fuse.new returns it, %.0f more after its first call (%.0f in all)")
  :format((h1 - h0) / M, (h2 - h1) / M, (h2 - h0) / M))
