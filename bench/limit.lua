-- bench/limit.lua -- what max_concurrent adds to a guarded call, in ns, under LuaJIT.
--
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" luajit bench/limit.lua [--rounds R] [--json]
--
-- Method: two loops, each its own prototype (so each gets its own trace), over the same
-- tiny function guarded two ways: `fuse.wrap(tiny, { fails = 5, window = 10 })` and the
-- same with `max_concurrent = 100` (and, as a third, a named breaker in the registry with
-- it). Both are warmed up, then timed in PAIRS: each round runs the plain loop and the
-- limited loops one after the other (the order swapped every round) for N iterations,
-- timed with the thread's CPU clock, so a slow spell of the machine hits both alike and
-- time spent waiting for a CPU is left out. Per round the difference (limited - plain)
-- is taken; we print the median and the least of the per-round differences, and the
-- median ns of each loop. Each loop sums what it gets and the sum is checked, so the JIT
-- cannot drop the work. The target (issue 18): within 5 ns.
local ffi = require "ffi"
local fuse = require "fuse"

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local summary = require "stats"
local median = summary.median

local ROUNDS, JSON = 31, false
do
  local i = 1
  while arg and arg[i] do
    if arg[i] == "--json" then JSON = true
    elseif arg[i] == "--rounds" and tonumber(arg[i + 1]) then
      ROUNDS = math.max(3, math.floor(tonumber(arg[i + 1])))
      i = i + 1
    else
      io.stderr:write("usage: luajit bench/limit.lua [--rounds R] [--json]\n")
      os.exit(2)
    end
    i = i + 1
  end
end

ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } limit_timespec;
  int limit_clock_gettime(int clk, limit_timespec *tp) __asm__("clock_gettime");
]]
local ts = ffi.new("limit_timespec")
local function cpu()
  ffi.C.limit_clock_gettime(3, ts)  -- CLOCK_THREAD_CPUTIME_ID
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local function tiny(x) return x + 1 end
local function loop_of(label, g)
  return assert(load("local g = ...\nreturn function(n)\n  local s = 0\n  for i = 1, n do s = s + g(i) end\n"
    .. "  return s\nend\n", "=loop<" .. label .. ">"))(g)
end

local plain = fuse.wrap(tiny, { fails = 5, window = 10 })
local limited, lb = fuse.wrap(tiny, { fails = 5, window = 10, max_concurrent = 100 })
local named, nb = fuse.wrap(tiny, { name = "bench-limit", fails = 5, window = 10, max_concurrent = 100 })
local loops = {
  { key = "plain", label = "fuse.wrap, closed", run = loop_of("plain", plain) },
  { key = "limited", label = "fuse.wrap, closed, max_concurrent = 100", run = loop_of("limited", limited) },
  { key = "named", label = "the same, a named breaker (registry)", run = loop_of("named", named) },
}

local N = 2000000
local function expected(n) return n * (n + 1) / 2 + n end
for _, l in ipairs(loops) do
  assert(l.run(20000) == expected(20000), "warm-up: wrong sum")
end

local per = {}  -- per[key] = { ns of each round }
for _, l in ipairs(loops) do per[l.key] = {} end
for r = 1, ROUNDS do
  local first, last = 1, #loops
  local step = 1
  if r % 2 == 0 then first, last, step = #loops, 1, -1 end
  for i = first, last, step do
    local l = loops[i]
    local t0 = cpu()
    local s = l.run(N)
    local dt = cpu() - t0
    if s ~= expected(N) then error(("%s: summed %.17g, expected %.17g"):format(l.label, s, expected(N))) end
    per[l.key][r] = dt / N * 1e9
  end
end
local stats = lb:stats()
assert(stats.running == 0 and stats.full_total == 0, "the limited breaker holds permits after the rounds")
stats = nb:stats()
assert(stats.running == 0 and stats.full_total == 0, "the named breaker holds permits after the rounds")

local function least(t)
  local m = math.huge
  for _, v in ipairs(t) do m = math.min(m, v) end
  return m
end
local function diffs(key)
  local d = {}
  for r = 1, ROUNDS do d[r] = per[key][r] - per.plain[r] end
  return d
end

local load = summary.loadavg()
if JSON then
  local out = {}
  for _, key in ipairs({ "limited", "named" }) do
    local d = diffs(key)
    out[#out + 1] = ('  {"case": "%s", "plain_ns_median": %.2f, "ns_median": %.2f, "extra_ns_median": %.2f,'
      .. ' "extra_ns_min": %.2f, "rounds": %d, "load": "%s"}'):format(key, median(per.plain), median(per[key]),
      median(d), least(d), ROUNDS, load)
  end
  print("[\n" .. table.concat(out, ",\n") .. "\n]")
  return
end
print(("max_concurrent's cost per call, %d paired rounds of %d calls (thread CPU time), load %s")
  :format(ROUNDS, N, load))
print(("%-42s %10s %14s %14s"):format("case", "ns median", "extra median", "extra least"))
print(("%-42s %10.2f"):format(loops[1].label, median(per.plain)))
for i = 2, #loops do
  local d = diffs(loops[i].key)
  print(("%-42s %10.2f %+14.2f %+14.2f"):format(loops[i].label, median(per[loops[i].key]), median(d), least(d)))
end
print("target (issue 18): the extra within 5 ns")
