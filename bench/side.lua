-- bench/side.lua -- the hot path of this tree side by side with another tree, in one run.
--
--   luajit bench/side.lua --base DIR [--label REV] [--this DIR] [--rounds R] [--quick] [--wall]
--                         [--no-callgrind]
--
-- `make bench BASE=<rev>` (or `make bench-side BASE=<rev>`) builds <rev> from git into
-- build/base/<rev>/ and runs this with --base there. DIR is a tree with lua/ and a built
-- build/fuse/core.so; --this defaults to the current directory.
--
-- Method. The loops are this tree's bench/bench.lua (cases "fuse.wrap, closed", "fuse.wrap,
-- open (rejected)", "fuse.wrap, forced_open", "b:allow() + b:report(t, true)", "rule:
-- named breaker", and the bare call and pcall it always runs), run against each tree's
-- lua/ and build/ in a process of its own (bench.lua --json --rounds 5 --cpu: each round
-- timed with the thread's CPU clock, so that on a loaded machine the time the process
-- waited for a CPU is left out; --wall times with CLOCK_MONOTONIC instead). The two trees
-- take turns, R rounds (6 by default) of one process each, the order swapped every round
-- so that a slow spell of the machine hits both alike. Each process times 5 rounds per
-- case (about 0.1 s each); per tree we print the least time of all its timed rounds and
-- the median of its processes' medians, and per case the difference and ratio of the
-- least times (this - base, this / base), with the range of the ratios of the per-round
-- medians (the pairs of one round ran next to each other). The targets (issue 16) are
-- read on the least times: on a loaded machine a round only gets slower. --quick: each
-- process runs bench.lua --quick (3 rounds of 0.02 s, a smoke run). Then, unless
-- --no-callgrind or valgrind is missing, instructions per iteration: bench/instr.lua
-- CASE N under `valgrind --tool=callgrind` with N = 100,000 and 1,100,000,
-- (total(1.1e6) - total(1e5)) / 1e6, so start-up cancels out. Instruction counts do not
-- depend on the machine's load; the times do.

local BASE, LABEL, THIS, ROUNDS, CALLGRIND, QUICK, WALL = nil, nil, ".", 6, true, false, false
do
  local function usage()
    io.stderr:write("usage: luajit bench/side.lua --base DIR [--label REV] [--this DIR] [--rounds R]"
      .. " [--quick] [--wall] [--no-callgrind]\n")
    os.exit(2)
  end
  local i = 1
  while arg[i] do
    local a, v = arg[i], arg[i + 1]
    if a == "--base" and v then BASE, i = v, i + 1
    elseif a == "--label" and v then LABEL, i = v, i + 1
    elseif a == "--this" and v then THIS, i = v, i + 1
    elseif a == "--rounds" and tonumber(v) and tonumber(v) >= 1 then ROUNDS, i = math.floor(tonumber(v)), i + 1
    elseif a == "--no-callgrind" then CALLGRIND = false
    elseif a == "--quick" then QUICK = true
    elseif a == "--wall" then WALL = true
    else usage() end
    i = i + 1
  end
  if not BASE then usage() end
end

local LUAJIT = arg[-1] or "luajit"

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function abs(dir)
  local p = io.popen("cd " .. sh_quote(dir) .. " && pwd")
  local d = p:read("*l")
  p:close()
  if not d then error("bench/side.lua: no directory " .. dir) end
  return d
end

local trees = {
  { key = "base", dir = abs(BASE) },
  { key = "this", dir = abs(THIS) },
}
local HERE = abs(arg[0]:match("^(.*)/[^/]*$") or ".")  -- bench/ of this tree: its loops serve both
package.path = HERE .. "/?.lua;" .. package.path
local stats = require "stats"
trees[1].label = LABEL or trees[1].dir
trees[2].label = "this tree (" .. trees[2].dir .. ")"
for _, t in ipairs(trees) do
  local f = io.open(t.dir .. "/build/fuse/core.so")
  if not f then error("bench/side.lua: " .. t.dir .. "/build/fuse/core.so is not built") end
  f:close()
end

local function env(t)
  return ("LUA_PATH=%s LUA_CPATH=%s "):format(sh_quote(t.dir .. "/lua/?.lua;" .. t.dir .. "/lua/?/init.lua;;"),
    sh_quote(t.dir .. "/build/?.so;;"))
end

local function run(cmd)
  local p = io.popen(cmd)
  local out = p:read("*a")
  local ok, _, code = p:close()
  if ok ~= true and ok ~= 0 then error("bench/side.lua: failed (" .. tostring(code) .. "): " .. cmd .. "\n" .. out) end
  return out
end

local loadavg = stats.loadavg

-- The cases, in bench.lua's names, and what issue 16 asks of each (nil: shown only).
local CASES = {
  { name = "fuse.wrap, closed", short = "closed call", ratio = 1.10 },
  { name = "fuse.wrap, open (rejected)", short = "open rejection", ratio = 1.10 },
  { name = "fuse.wrap, forced_open", short = "forced_open rejection", ratio = 1.10 },
  { name = "b:allow() + b:report(t, true)", short = "allow + report", diff = 1.0 },
  { name = "rule: named breaker", short = "named breaker, closed" },
  { name = "pcall", short = "pcall (the machine's speed)" },
}
-- (anchored: bench.lua has cases that the base may not know, such as max_concurrent's)
local ONLY = "--only '^fuse%.wrap, closed$' --only '^fuse%.wrap, open %(rejected%)$'"
  .. " --only '^fuse%.wrap, forced_open$' --only '^b:allow%(%) %+ b:report%(t, true%)$'"
  .. " --only '^rule: named breaker$'"

local times = { base = {}, this = {} }  -- times[tree][case] = { median of each round }
local mins = { base = {}, this = {} }   -- mins[tree][case] = the least time of any round
local loads = { loadavg() }
local jit_bad = {}
for r = 1, ROUNDS do
  local order = r % 2 == 1 and { trees[1], trees[2] } or { trees[2], trees[1] }
  for _, t in ipairs(order) do
    local out = run(("%s%s %s --json %s%s %s 2>&1"):format(env(t), sh_quote(LUAJIT),
      sh_quote(HERE .. "/bench.lua"), QUICK and "--quick" or "--rounds 5", WALL and "" or " --cpu", ONLY))
    local got = 0
    for line in out:gmatch("[^\n]+") do
      local name = line:match('"case": "([^"]*)"')
      if name then got = got + 1 end
      local med = tonumber(line:match('"ns_median": ([%d.]+)'))
      local mn = tonumber(line:match('"ns_min": ([%d.]+)'))
      if name and med and mn then
        mins[t.key][name] = math.min(mins[t.key][name] or math.huge, mn)
        local list = times[t.key][name] or {}
        list[#list + 1] = med
        times[t.key][name] = list
        local link = line:match('"loop_trace": "([^"]*)"')
        if link ~= "loop" and name ~= "bare call" and name ~= "pcall" then
          jit_bad[#jit_bad + 1] = ("%s, %s: loop trace %s"):format(t.key, name, tostring(link))
        end
      end
    end
    -- (LuaJIT's popen close does not give the exit status: a failed run shows here)
    if got < #CASES + 1 then error(("bench/side.lua: %s: bench.lua gave %d cases, not %d:\n%s")
      :format(t.dir, got, #CASES + 1, out)) end
  end
  io.stderr:write(("bench/side.lua: round %d of %d done (load %s)\n"):format(r, ROUNDS, loadavg()))
end
loads[2] = loadavg()

local median = stats.median

print(("side by side, %s UTC: base %s against %s"):format(os.date("!%Y-%m-%d %H:%M"), trees[1].label, trees[2].label))
print(("%d rounds, alternating (one bench.lua %s%s process per tree per round); 1-minute load %s at"
  .. " the start, %s at the end"):format(ROUNDS, QUICK and "--quick" or "--rounds 5", WALL and "" or " --cpu",
  loads[1], loads[2]))
print(("ns per call (%s): the least of all timed rounds (and the median of the processes' medians)")
  :format(WALL and "CLOCK_MONOTONIC" or "the thread's CPU time"))
local fmt = "%-30s %17s %17s %8s %7s %13s  %s"
print(fmt:format("case", "base", "this", "diff ns", "ratio", "round ratios", "target"))
for _, c in ipairs(CASES) do
  local b, t = times.base[c.name], times.this[c.name]
  if b and t and #b > 0 and #t > 0 then
    local lb, lt = mins.base[c.name], mins.this[c.name]
    local lo, hi = math.huge, 0
    for i = 1, math.min(#b, #t) do
      lo, hi = math.min(lo, t[i] / b[i]), math.max(hi, t[i] / b[i])
    end
    local target = ""
    if c.ratio then
      target = ("ratio <= %.2f: %s"):format(c.ratio, lt / lb <= c.ratio and "met" or "NOT met")
    elseif c.diff then
      target = ("diff <= %.1f ns: %s"):format(c.diff, lt - lb <= c.diff and "met" or "NOT met")
    end
    print(fmt:format(c.short, ("%.2f (%.2f)"):format(lb, median(b)), ("%.2f (%.2f)"):format(lt, median(t)),
      ("%+.2f"):format(lt - lb), ("%.3f"):format(lt / lb), ("%.2f-%.2f"):format(lo, hi), target))
  end
end
for _, msg in ipairs(jit_bad) do print("  JIT: " .. msg .. " (not one closed loop trace)") end

if not CALLGRIND then return end
if not os.execute("command -v valgrind >/dev/null 2>&1") then
  print("\n(no valgrind: instruction counts skipped)")
  return
end

local N1, N2 = 100000, 1100000
local function instructions(t, case, n)
  local out = run(("%svalgrind --tool=callgrind --callgrind-out-file=/dev/null %s %s %s %d 2>&1 >/dev/null")
    :format(env(t), sh_quote(LUAJIT), sh_quote(HERE .. "/instr.lua"), case, n))
  local total = out:match("Collected : (%d+)")
  if not total then error("bench/side.lua: no instruction count from callgrind:\n" .. out) end
  return tonumber(total)
end
print()
print(("instructions per iteration (callgrind: bench/instr.lua CASE N, (Ir(N=%d) - Ir(N=%d)) / %d)")
  :format(N2, N1, N2 - N1))
local ifmt = "%-30s %10s %10s %8s"
print(ifmt:format("case", "base", "this", "diff"))
for _, c in ipairs({ { "allow+report", "allow + report" }, { "closed", "closed call" },
  { "open", "open rejection" }, { "forced_open", "forced_open rejection" } }) do
  local per = {}
  for _, t in ipairs(trees) do
    per[t.key] = (instructions(t, c[1], N2) - instructions(t, c[1], N1)) / (N2 - N1)
  end
  print(ifmt:format(c[2], ("%.1f"):format(per.base), ("%.1f"):format(per.this), ("%+.1f"):format(per.this - per.base)))
end
