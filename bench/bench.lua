-- bench/bench.lua -- what a guarded call costs, in ns per call, under LuaJIT.
--
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" luajit bench/bench.lua
--   ... luajit bench/bench.lua --json      the same numbers as JSON (for bench/README.md)
--   ... luajit bench/bench.lua --quick     fewer, shorter rounds (a smoke run; noisy)
--   ... luajit bench/bench.lua --only PAT  only the cases whose name matches the Lua pattern
--                                          (repeatable: a case matching any of them runs)
--   ... luajit bench/bench.lua --rounds R  R timed rounds per case instead of 9
--   ... luajit bench/bench.lua --cpu       time the rounds with the thread's CPU clock
--                                          (CLOCK_THREAD_CPUTIME_ID): on a loaded machine
--                                          the time the process waited for a CPU is left out
--
-- Method: each case is its own loop function (so it gets its own JIT trace), warmed up,
-- then timed over ROUNDS rounds of N iterations with CLOCK_MONOTONIC; N is picked per case
-- so a round lasts about TARGET seconds (at most 1e7 iterations). We report the median and
-- the minimum ns/call over the rounds. Nothing is subtracted: "over bare" is the difference
-- of two medians, printed as such. Every loop sums what it gets into `s`, and every round's
-- sum is checked against the exact expected value, so the JIT cannot drop the work and a
-- wrong result stops the run. Trace aborts seen during warm-up are listed under the table.

local ffi = require "ffi"
local jit = require "jit"
local fuse = require "fuse"

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local purelua = require "purelua"
local stats = require "stats"

local JSON, QUICK, ONLY, NROUNDS, CPU = false, false, nil, nil, false
do
  local function usage()
    io.stderr:write("usage: luajit bench/bench.lua [--json] [--quick] [--only PATTERN]... [--rounds R] [--cpu]\n")
    os.exit(2)
  end
  local i = 1
  while arg and arg[i] do
    local a = arg[i]
    if a == "--json" then JSON = true
    elseif a == "--quick" then QUICK = true
    elseif a == "--cpu" then CPU = true
    elseif a == "--only" and arg[i + 1] then
      i = i + 1
      ONLY = ONLY or {}
      ONLY[#ONLY + 1] = arg[i]
    elseif a == "--rounds" and tonumber(arg[i + 1]) and tonumber(arg[i + 1]) >= 1 then
      i = i + 1
      NROUNDS = math.floor(tonumber(arg[i]))
    else usage()
    end
    i = i + 1
  end
end

local ROUNDS = NROUNDS or QUICK and 3 or 9
local TARGET = QUICK and 0.02 or 0.1     -- seconds per round
local MAX_N, MIN_N = 1e7, 1e4

ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
  int bench_clock_gettime(int clk, bench_timespec *tp) __asm__("clock_gettime");
]]
local C = ffi.C
local CLOCK_MONOTONIC, CLOCK_MONOTONIC_COARSE = 1, 6
local ts = ffi.new("bench_timespec")
local function now()
  C.bench_clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end
-- The clock the rounds are timed with: CLOCK_MONOTONIC, or with --cpu the thread's CPU time.
local CLOCK_THREAD_CPUTIME_ID = 3
local timer = now
if CPU then
  timer = function()
    C.bench_clock_gettime(CLOCK_THREAD_CPUTIME_ID, ts)
    return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
  end
end
-- The clock fuse's core reads, handed to the pure-Lua breaker. Each user gets its own
-- copy (its own prototype), so no case links into a trace another case left behind.
local function coarse_clock_fn()
  return assert(load([[
    local C, ts = ...
    return function()
      C.bench_clock_gettime(6, ts)  -- CLOCK_MONOTONIC_COARSE
      return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
    end]], "=coarse_clock"))(C, ffi.new("bench_timespec"))
end
assert(CLOCK_MONOTONIC_COARSE == 6)

-- The function every case guards: tiny, so the wrapper's cost shows.
local function tiny(x) return x + 1 end
local function sum_tiny(n) return n * (n + 1) / 2 + n end   -- sum of tiny(i), i = 1..n
local function count(n) return n end

-- A function that can be told to fail (`nil, err`), to drive breakers open.
local failing = false
local function flaky(x)
  if failing then return nil, "down" end
  return x + 1
end

local function drive_open(call, fails)
  failing = true
  for _ = 1, fails do call(0) end
  failing = false
end

-- The chunk name of a case's loop, at most 39 characters: OpenResty's LuaJIT gives an
-- address, not the name, in jit.util.funcinfo for a longer one, which hid the loop
-- traces of the max_concurrent cases from trace_watch. (Only compared within a case.)
local function loop_source(casename) return "loop<" .. casename:sub(1, 33) .. ">" end

-- Each loop gets its own prototype (compiled from a template with load), so every case
-- gets its own root trace: a loop shared between cases would be specialised to the first
-- case's function and chain side traces for the others.
local function loop_of(casename, param, body, value)
  local src = ("local %s = ...\nreturn function(n)\n  local s = 0\n  for i = 1, n do\n    %s\n  end\n  return s\nend\n")
    :format(param, body)
  return assert(load(src, "=" .. loop_source(casename)))(value)
end

local CALL = "s = s + g(i)"
local REJECTED = "local r, rej = g(i); if r == nil and rej then s = s + 1 end"

-- Each case: name, group, and setup(name) returning loop(n) -> s, expected(n) and a check
-- that the breaker is still in the state under test after the rounds.
local cases = {}
local function case(group, name, setup) cases[#cases + 1] = { group = group, name = name, setup = setup } end

case("call", "bare call", function(name)
  return loop_of(name, "tiny", "s = s + tiny(i)", tiny), sum_tiny
end)

case("call", "pcall", function(name)
  return loop_of(name, "tiny", "local _, r = pcall(tiny, i); s = s + r", tiny), sum_tiny
end)

case("call", "fuse.wrap, closed", function(name)
  local g, b = fuse.wrap(tiny, { fails = 5, window = 10 })
  return loop_of(name, "g", CALL, g), sum_tiny, function() return b:state() == "closed" end
end)

case("call", "fuse.wrap, closed, max_concurrent = 100", function(name)
  local g, b = fuse.wrap(tiny, { fails = 5, window = 10, max_concurrent = 100 })
  return loop_of(name, "g", CALL, g), sum_tiny, function()
    local s = b:stats()
    return s.state == "closed" and s.running == 0 and s.full_total == 0
  end
end)

case("call", "fuse.wrap, closed, shared max_concurrent", function(name)
  local g, b = fuse.wrap(tiny, { name = "bench-limited", fails = 5, window = 10, max_concurrent = 100 })
  return loop_of(name, "g", CALL, g), sum_tiny, function()
    local s = b:stats()
    return s.state == "closed" and s.running == 0 and s.full_total == 0
  end
end)

case("call", "fuse.wrap, full (rejected, max_concurrent)", function(name)
  local b = fuse.new { fails = 5, window = 10, max_concurrent = 1 }
  local g = b:wrap(tiny)
  local held = b:allow()  -- the one permit, held for the whole case
  assert(held and b:stats().running == 1)
  return loop_of(name, "g", REJECTED, g), count, function() return b:stats().running == 1 end
end)

case("call", "fuse.wrap, open (rejected)", function(name)
  local g, b = fuse.wrap(flaky, { fails = 5, window = 10, open_for = 86400 })
  drive_open(g, 5)
  assert(b:state() == "open", "fuse breaker did not open: " .. b:state())
  return loop_of(name, "g", REJECTED, g), count, function() return b:state() == "open" end
end)

case("call", "fuse.wrap, forced_open", function(name)
  local g, b = fuse.wrap(tiny, { fails = 5, window = 10 })
  b:force_open()
  return loop_of(name, "g", REJECTED, g), count, function() return b:state() == "forced_open" end
end)

case("call", "b:allow() + b:report(t, true)", function(name)
  local b = fuse.new { fails = 5, window = 10 }
  local body = "local t = b:allow(); b:report(t, true); if t then s = s + 1 end"
  return loop_of(name, "b", body, b), count, function() return b:state() == "closed" end
end)

case("call", "purelua, closed", function(name)
  local g, b = purelua.wrap(tiny, { fails = 5, window = 10, clock = coarse_clock_fn() })
  return loop_of(name, "g", CALL, g), sum_tiny, function() return b.state == "closed" end
end)

case("call", "purelua, open (rejected)", function(name)
  local g, b = purelua.wrap(flaky, { fails = 5, window = 10, open_for = 1e9, clock = coarse_clock_fn() })
  drive_open(g, 5)
  assert(b.state == "open", "purelua breaker did not open")
  return loop_of(name, "g", REJECTED, g), count, function() return b.state == "open" end
end)

-- The cost of each rule on the hot path, closed state: compare with "fuse.wrap, closed".
local function rule(name, opts)
  case("rule", name, function(lname)
    local g, b = fuse.wrap(tiny, opts)
    return loop_of(lname, "g", CALL, g), sum_tiny, function() return b:state() == "closed" end
  end)
end
rule("rule: fails (= fuse.wrap, closed)", { fails = 5, window = 10 })
rule("rule: failure_rate+min_calls", { failure_rate = 0.5, min_calls = 10 })
rule("rule: slow (times each call)", { slow = 1 })
rule("rule: count_window", { count_window = 100 })
rule("rule: named breaker", { name = "bench.named", fails = 5, window = 10 })
rule("rule: with a fallback", { fails = 5, window = 10, fallback = function() return 0 end })

-- A long-lived process: request handlers often run interpreted, and a gateway has
-- thousands of call sites. LuaJIT starts traces at the entries of the functions they
-- call and blacklists an entry whose traces keep aborting, after which everything that
-- reaches it runs interpreted for the rest of the process. age_process() makes 100,000
-- guarded calls of each kind below from code the JIT never compiles, then runs 2,000
-- call sites of their own; the "long-lived" cases then measure the same loops as the
-- fresh ones. They should cost what the fresh ones cost (target: within 20%).
local aged
local function age_process()
  if aged then return aged end
  local t0 = now()
  local g1 = fuse.wrap(tiny, { fails = 5, window = 10 })
  local g2, b2 = fuse.wrap(flaky, { fails = 5, window = 10, open_for = 86400 })
  drive_open(g2, 5)
  assert(b2:state() == "open", "fuse breaker did not open: " .. b2:state())
  local b3 = fuse.new { fails = 5, window = 10 }
  local callers = {
    assert(load("local g = ... return function(i) return g(i) end", "=interpreted<closed>"))(g1),
    assert(load("local g = ... return function(i) return g(i) end", "=interpreted<rejected>"))(g2),
    assert(load("local b = ... return function() b:report(b:allow(), true) end", "=interpreted<allow>"))(b3),
  }
  for _, caller in ipairs(callers) do
    jit.off(caller)
    for i = 1, 100000 do caller(i) end
  end
  local sites = { g1, g2 }
  for k = 1, 2000 do
    local src = "local g = ... return function(n) local s = 0 for i = 1, n do "
      .. "local r = g(i) if r then s = s + 1 end end return s end -- %d"
    local site = assert(load(src:format(k), "=site<" .. k .. ">"))(sites[k % 2 + 1])
    site(60)
  end
  aged = now() - t0
  return aged
end

local function long_lived(name, setup)
  case("long-lived", "long-lived: " .. name, function(lname)
    age_process()
    return setup(lname)
  end)
end
long_lived("closed", function(name)
  local g, b = fuse.wrap(tiny, { fails = 5, window = 10 })
  return loop_of(name, "g", CALL, g), sum_tiny, function() return b:state() == "closed" end
end)
long_lived("rejected", function(name)
  local g, b = fuse.wrap(flaky, { fails = 5, window = 10, open_for = 86400 })
  drive_open(g, 5)
  return loop_of(name, "g", REJECTED, g), count, function() return b:state() == "open" end
end)
long_lived("allow + report", function(name)
  local b = fuse.new { fails = 5, window = 10 }
  local body = "local t = b:allow(); b:report(t, true); if t then s = s + 1 end"
  return loop_of(name, "b", body, b), count, function() return b:state() == "closed" end
end)

-- What reading the time costs, for reference (which clock a breaker reads matters).
local function clock_case(name, clk)
  case("clock", name, function(lname)
    return loop_of(lname, "clk", "if clk() > 0 then s = s + 1 end", clk), count
  end)
end
clock_case("clock: os.time (1 s resolution)", os.time)
clock_case("clock: os.clock (CPU time)", os.clock)
clock_case("clock: FFI CLOCK_MONOTONIC", now)
clock_case("clock: FFI CLOCK_MONOTONIC_COARSE", coarse_clock_fn())

-- JIT trace events during warm-up. What matters is the case's own loop: its root trace
-- should start in loop<case> and link to itself ("loop"). Aborts of traces started
-- elsewhere are listed too, marked: one that started in a function of fuse is a fault
-- (an entry whose traces keep aborting gets blacklisted, and then every loop through it
-- runs interpreted: see the long-lived cases).
local vmdef = require "jit.vmdef"
local jutil = require "jit.util"
local function loc(func, pc)
  local fi = jutil.funcinfo(func, pc)
  if fi.loc then return fi.loc end
  if fi.ffid then return vmdef.ffnames[fi.ffid] or "?" end
  return "?"
end
local function abort_reason(code, info)
  local msg = vmdef.traceerr[code] or tostring(code)
  if info == nil then return msg end
  if msg:find("bytecode %%d") and type(info) == "number" then   -- name the bytecode
    return (msg:gsub("bytecode %%d", "bytecode " .. vmdef.bcnames:sub(info * 6 + 1, info * 6 + 6):gsub(" ", "")))
  end
  if type(info) == "number" and msg:find("%%s") and vmdef.ffnames[info] then info = vmdef.ffnames[info] end
  return (msg:gsub("%%[ds]", tostring(info), 1))
end
local function trace_watch(into, casename)
  local started = {}
  local loopsrc = loop_source(casename)
  return function(what, tr, func, pc, otr, oex)
    if what == "start" then
      started[tr] = { at = loc(func, pc), root = not otr or otr == 0 }
    elseif what == "stop" then
      into.traces = into.traces + 1
      local st = started[tr]
      into.stops[#into.stops + 1] = ("#%d at %s -> %s"):format(tr, st and st.at or "?", jutil.traceinfo(tr).linktype)
      if st and st.root and st.at:sub(1, #loopsrc) == loopsrc then
        into.loop = ("#%d -> %s"):format(tr, jutil.traceinfo(tr).linktype)
        into.loop_link = jutil.traceinfo(tr).linktype
      end
    elseif what == "abort" then
      local st = started[tr] or { at = "?", root = true }
      local inloop = st.at:sub(1, #loopsrc) == loopsrc
      -- a side trace that aborts blacklists nothing: only root traces count here
      local infuse = st.root and (st.at:find("^fuse%.lua:") or st.at:find("^ffi%.lua:")
        or st.at:find("^pending%.lua:"))
      into.aborts[#into.aborts + 1] = ("%s trace %d started at %s%s, aborted at %s: %s"):format(
        st.root and "root" or "side", tr, st.at, inloop and " (THE LOOP)" or infuse and " (IN FUSE)" or "",
        loc(func, pc), abort_reason(otr, oex))
    end
  end
end

local median = stats.median

local function round_n(x)   -- one significant digit, within [MIN_N, MAX_N]
  if x >= MAX_N then return MAX_N end
  if x <= MIN_N then return MIN_N end
  local p = 10 ^ math.floor(math.log10(x))
  return math.floor(x / p) * p
end

local loadavg = stats.loadavg
local load_start = loadavg()

local sink = 0
local function run(c)
  local loop, expected, still_ok = c.setup(c.name)
  local jitinfo = { traces = 0, aborts = {}, stops = {}, loop = "none compiled", loop_link = "none" }
  local watch = trace_watch(jitinfo, c.name)
  jit.attach(watch, "trace")
  -- warm-up, unrolled: a loop here would be traced too and add its own events
  sink = sink + loop(1000)
  sink = sink + loop(1000)
  sink = sink + loop(1000)
  local t0 = timer()
  local s = loop(MIN_N)
  local est = (timer() - t0) / MIN_N
  jit.attach(watch)       -- detach before timing
  sink = sink + s
  local n = round_n(TARGET / math.max(est, 1e-10))
  local ns = {}
  for r = 1, ROUNDS do
    t0 = timer()
    s = loop(n)
    local dt = timer() - t0
    if s ~= expected(n) then
      error(("%s: round %d summed %.17g, expected %.17g"):format(c.name, r, s, expected(n)))
    end
    sink = sink + s
    ns[r] = dt / n * 1e9
  end
  if still_ok and not still_ok() then error(c.name .. ": the breaker left the state under test") end
  local mn = math.huge
  for r = 1, #ns do if ns[r] < mn then mn = ns[r] end end
  c.n, c.rounds, c.median, c.min, c.jit = n, ROUNDS, median(ns), mn, jitinfo
  return c
end

local results = {}
local by_name = {}
for _, c in ipairs(cases) do
  local wanted = not ONLY or c.name == "bare call" or c.name == "pcall"
  for _, pat in ipairs(ONLY or {}) do wanted = wanted or c.name:find(pat) ~= nil end
  if wanted then
    results[#results + 1] = run(c)
    by_name[c.name] = c
    collectgarbage()
  end
end
local load_end = loadavg()
local bare, pc = by_name["bare call"].median, by_name["pcall"].median
for _, c in ipairs(results) do
  c.vs_bare, c.vs_pcall, c.over_bare = c.median / bare, c.median / pc, c.median - bare
end

local function esc(s) return (s:gsub('[%c"\\]', function(ch) return ("\\u%04x"):format(ch:byte()) end)) end
local function num(x) return ("%.3f"):format(x) end

if JSON then
  local out = {}
  out[#out + 1] = "{"
  out[#out + 1] = ('  "date": "%s",'):format(os.date("!%Y-%m-%dT%H:%M:%SZ"))
  out[#out + 1] = ('  "command": "%s",'):format(esc("luajit bench/bench.lua " .. table.concat(arg, " ")))
  out[#out + 1] = ('  "luajit": "%s", "arch": "%s", "os": "%s",'):format(esc(jit.version), jit.arch, jit.os)
  out[#out + 1] = ('  "fuse": "%s", "backend": "%s",'):format(esc(tostring(fuse.VERSION)), esc(tostring(fuse._backend)))
  out[#out + 1] = ('  "rounds": %d, "clock": "%s", "sink": %.17g, "loadavg_start": "%s", "loadavg_end": "%s",')
    :format(ROUNDS, CPU and "thread CPU time" or "monotonic", sink, load_start, load_end)
  out[#out + 1] = '  "cases": ['
  for i, c in ipairs(results) do
    local ab = {}
    for k, a in ipairs(c.jit.aborts) do ab[k] = '"' .. esc(a) .. '"' end
    out[#out + 1] = ('    {"case": "%s", "group": "%s", "n": %d, "ns_median": %s, "ns_min": %s, '
      .. '"vs_bare": %s, "vs_pcall": %s, "over_bare_ns": %s, "loop_trace": "%s", "traces": %d, "aborts": [%s]}%s')
      :format(esc(c.name), c.group, c.n, num(c.median), num(c.min), num(c.vs_bare), num(c.vs_pcall),
        num(c.over_bare), esc(c.jit.loop_link), c.jit.traces, table.concat(ab, ", "), i < #results and "," or "")
  end
  out[#out + 1] = "  ]"
  out[#out + 1] = "}"
  print(table.concat(out, "\n"))
else
  print(("fuse %s (%s backend), %s %s/%s, %s UTC; %d rounds per case, median and min%s"):format(
    tostring(fuse.VERSION), tostring(fuse._backend), jit.version, jit.os, jit.arch,
    os.date("!%Y-%m-%d %H:%M"), ROUNDS, CPU and " (thread CPU time)" or ""))
  print(("1-minute load average: %s at the start, %s at the end (%s: other work on the machine)"):format(
    load_start, load_end, "above ~0.2"))
  local fmt = "%-38s %10s %9s %9s %9s %14s %9s"
  print(fmt:format("case", "ns/call", "min", "x bare", "x pcall", "over bare (ns)", "N/round"))
  local group
  for _, c in ipairs(results) do
    if c.group ~= group then
      if group then print() end
      group = c.group
    end
    print(fmt:format(c.name, ("%.2f"):format(c.median), ("%.2f"):format(c.min), ("%.1f"):format(c.vs_bare),
      ("%.2f"):format(c.vs_pcall), ("%+.2f"):format(c.over_bare), ("%.0e"):format(c.n)))
  end
  print()
  local function ratio(a, b)
    local x, y = by_name[a], by_name[b]
    if x and y then
      print(("  %-38s %6.2f ns fresh, %6.2f ns long-lived: x%.2f"):format(a, x.median, y.median,
        y.median / x.median))
    end
  end
  if aged then
    print(("Long-lived process (100,000 interpreted calls of each kind and 2,000 call sites first,"
      .. " %.1f s):"):format(aged))
    ratio("fuse.wrap, closed", "long-lived: closed")
    ratio("fuse.wrap, open (rejected)", "long-lived: rejected")
    ratio("b:allow() + b:report(t, true)", "long-lived: allow + report")
    print()
  end
  print("JIT, during warm-up: the root trace of each case's loop and how it links (\"loop\" = the")
  print("whole iteration compiled into one trace), then any trace aborts. An abort marked (THE LOOP)")
  print("slows the loop; a root trace marked (IN FUSE) started in a function of fuse: a fault, since an")
  print("entry whose traces keep aborting gets blacklisted, and every loop through it then runs")
  print("interpreted. (A side trace that aborts blacklists nothing.)")
  for _, c in ipairs(results) do
    local flag = c.jit.loop_link == "loop" and "" or "   <-- not a closed loop trace: "
      .. table.concat(c.jit.stops, ", ")
    print(("  %-36s loop trace %s, %d traces%s"):format(c.name, c.jit.loop, c.jit.traces, flag))
    for _, a in ipairs(c.jit.aborts) do print("      abort: " .. a) end
  end
  print(("(sink %.17g)"):format(sink))
end
