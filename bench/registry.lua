-- bench/registry.lua -- the registry at 100, 10,000 and 100,000 names, under LuaJIT.
--
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" luajit bench/registry.lua
--
-- One process, fuse.init{ capacity = 131072 }. At each size it times, in ns per lookup
-- (median of 7 rounds of 200,000), over 1,000 names spread over the whole registry:
--   fuse.get(name)            the facade (an object cache by name + an identity check)
--   core find                 fz_registry_find_id through the FFI: the hash index alone
--   fuse.new{ name, fails }   of an existing name (options checked, object made each time)
-- Growing the registry times creation (names per second over the last 10% of the size:
-- half through fuse.new, half through the core alone), and reads the resident set
-- (/proc/self/statm) before and after, for bytes per breaker (the registry's share: the
-- Lua objects of fuse.new are collected before the reading).
local ffi = require "ffi"
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

fuse.init{ capacity = 131072 }

local function name(i) return "bench.registry.host-" .. i .. ".example.com" end

local made = 0
local CFG = B.config(fuse.new{ fails = 5 }._h)  -- the options fuse.new{ fails = 5 } gives
-- Grows the registry to n names: the last 10% timed, half through fuse.new (rate_new),
-- half through the core alone (B.open: fz_registry_open_id through the FFI, rate_core).
local function grow_to(n)
  local first = made + 1
  local tail = math.max(first, n - math.floor(n / 10) + 1)
  local mid = tail + math.floor((n - tail + 1) / 2)
  for i = first, tail - 1 do fuse.new{ name = name(i), fails = 5 } end
  collectgarbage()
  local rss0, t0 = rss_bytes(), now()
  for i = tail, mid - 1 do fuse.new{ name = name(i), fails = 5 } end
  local t1 = now()
  for i = mid, n do B.open(name(i), CFG) end
  local t2 = now()
  collectgarbage()
  local rss1 = rss_bytes()
  made = n
  return (mid - tail) / (t1 - t0), (n - mid + 1) / (t2 - t1), (rss1 - rss0) / (n - tail + 1)
end

local ROUNDS, N, HOT = 7, 200000, 1000

local function median(xs)
  table.sort(xs)
  return xs[math.ceil(#xs / 2)]
end

-- ns per call of f(names[i]) over a hot set of HOT names spread over the registry
local function time_lookup(make_loop, n, per)
  local names = {}
  for i = 1, HOT do names[i] = name(1 + math.floor((i - 1) * n / HOT)) end
  local loop = make_loop()
  loop(names, 3 * HOT * per)  -- warm-up: every name of the hot set looked up 3 times
  local r = {}
  for k = 1, ROUNDS do
    local t0 = now()
    loop(names, N)
    r[k] = (now() - t0) / N * 1e9
  end
  return median(r)
end

-- Each loop its own function (its own trace).
local LOOPS = {
  { "fuse.get(name)", function() return function(names, n)
      local get, s = fuse.get, 0
      for i = 1, n do if get(names[i % HOT + 1]) then s = s + 1 end end
      assert(s == n)
    end end },
  { "core find (hash index)", function() return function(names, n)
      local find, s = B.find, 0
      for i = 1, n do if find(names[i % HOT + 1]) then s = s + 1 end end
      assert(s == n)
    end end },
  { "fuse.new{ name, fails } existing", function() return function(names, n)
      local new, s = fuse.new, 0
      for i = 1, n / 20 do if new{ name = names[i % HOT + 1], fails = 5 } then s = s + 1 end end
      assert(s == n / 20)
    end end, 20 },
}

local SIZES = { 100, 10000, 100000 }
local rows = {}
for _, size in ipairs(SIZES) do
  local rate_new, rate_core, per = grow_to(size)
  local row = { size = size, rate_new = rate_new, rate_core = rate_core, bytes = per }
  for _, l in ipairs(LOOPS) do row[l[1]] = time_lookup(l[2], size, l[3] or 1) * (l[3] or 1) end
  rows[#rows + 1] = row
end

print(("registry: LuaJIT %s, capacity 131072, load %s"):format(jit.version,
  (io.open("/proc/loadavg") or { read = function() return "?" end }):read("*l"):match("^(%S+)")))
io.write(("%-36s"):format("ns per lookup, names registered:"))
for _, r in ipairs(rows) do io.write(("%12d"):format(r.size)) end
io.write("   100k/100\n")
for _, l in ipairs(LOOPS) do
  io.write(("%-36s"):format(l[1]))
  for _, r in ipairs(rows) do io.write(("%12.1f"):format(r[l[1]])) end
  io.write(("%9.2fx\n"):format(rows[#rows][l[1]] / rows[1][l[1]]))
end
io.write(("%-36s"):format("creations/s, fuse.new (last 5%)"))
for _, r in ipairs(rows) do io.write(("%12.0f"):format(r.rate_new)) end
io.write("\n")
io.write(("%-36s"):format("creations/s, core (last 5%)"))
for _, r in ipairs(rows) do io.write(("%12.0f"):format(r.rate_core)) end
io.write("\n")
io.write(("%-36s"):format("resident bytes per breaker created"))
for _, r in ipairs(rows) do io.write(("%12.0f"):format(r.bytes)) end
io.write("\n")
