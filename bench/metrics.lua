-- bench/metrics.lua -- fuse.metrics() at 1,000, 10,000 and 100,000 named breakers, under
-- LuaJIT (the Lua 5.4 C module backend too: lua5.4 with build/5.4 on LUA_CPATH).
--
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" luajit bench/metrics.lua
--   ... luajit bench/metrics.lua --base REV   # side by side with REV's lua/fuse/metrics.lua
--   ... luajit bench/metrics.lua --phases     # where the old formatter's time goes
--   ... luajit bench/metrics.lua --shared     # in a shared registry (nginx's: MAP_SHARED)
--
-- (Another tree's fuse with this script: LUA_PATH and LUA_CPATH of that tree, e.g.
-- make bench-side's build/base/<commit>; --shared then shows its core's stats reads.)
--
-- One process, fuse.init{ capacity = 131072 } (with shared = true under --shared), the
-- names of bench/registry.lua, with awkward values spread over them: failures and
-- successes in the window (failure rates such as 1/3), forced_open and disabled
-- breakers, a few names that need escapes.
-- At each size it times fuse.metrics() (CPU seconds of this process, os.clock, user and
-- system; median of ROUNDS, each after a full collection), alone and with the full
-- collection after it (its garbage: what a worker pays for a scrape sooner or later),
-- and gives the bytes of its text. With --base, the fuse.metrics of REV's
-- lua/fuse/metrics.lua (git show) is made over the same backend and a copy of the walk
-- of the registry it was written for, and the two are timed in alternated rounds (each
-- round's order swapped); their texts must be equal.
local fuse = require "fuse"

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local stats = require "stats"

local B = jit and require("fuse.ffi") or require("fuse.core")

local base, phases, shared, ROUNDS = nil, false, false, 5
do
  local i = 1
  while i <= #arg do
    if arg[i] == "--base" then base, i = arg[i + 1], i + 1
    elseif arg[i] == "--phases" then phases = true
    elseif arg[i] == "--shared" then shared = true
    elseif arg[i] == "--rounds" then ROUNDS, i = tonumber(arg[i + 1]), i + 1
    else error("bench/metrics.lua: unknown argument " .. tostring(arg[i])) end
    i = i + 1
  end
end

fuse.init{ capacity = 131072, shared = shared }

local function name(i)
  if i % 997 == 0 then return "bench.metrics.\"quoted\\" .. i .. "\n\255" end  -- escapes, not UTF-8
  return "bench.registry.host-" .. i .. ".example.com"
end
local function ok() return true end
local function fail() return nil, "down" end

-- Makes breakers up to n, with values that vary from one breaker to the next.
local made = 0
local function grow_to(n)
  for i = made + 1, n do
    local b = fuse.new{ name = name(i), fails = 1000, window = 3600 }
    for _ = 1, i % 4 do b:call(ok) end
    for _ = 1, i % 3 do b:call(fail) end
    if i % 101 == 0 then b:force_open() elseif i % 103 == 0 then b:disable() end
  end
  made = n
end

-- The walk of lua/fuse.lua's each_breaker for a formatter from another revision (a
-- copy): fn(h, name, id) since this change, fn(h, name, still) with a closure per slot
-- before it (load_metrics gives the base the one its metrics.lua calls).
local function walk(fn, with_closure)
  local i, n = 0, B.count()
  while i < n do
    local h = B.at(i)
    local id = h and B.id(h)
    i = i + 1
    if h then
      local nm = B.name_of(h)
      local third = with_closure and function() return B.id(h) == id end or id
      if fn(h, nm, third) then break end
    end
  end
  return i
end

local function load_metrics(src, label)
  local chunk = assert((loadstring or load)(src, "=" .. label))
  local with_closure = src:find("still()", 1, true) ~= nil
  return chunk().new(B, function(fn) return walk(fn, with_closure) end, function() end).metrics
end

local formatters = { { "this tree", fuse.metrics } }
if base then
  local p = assert(io.popen("git show " .. base .. ":lua/fuse/metrics.lua"))
  local src = p:read("*a")
  p:close()
  assert(#src > 0, "bench/metrics.lua: no lua/fuse/metrics.lua at " .. base)
  table.insert(formatters, 1, { base, load_metrics(src, base .. ":lua/fuse/metrics.lua") })
end

local function cpu(fn)
  local t0 = os.clock()
  local r = fn()
  return os.clock() - t0, r
end

-- Where the time of the formatter before this change went (--phases), each step alone
-- over the registry: a table per breaker, label() per name, one %.17g format per line.
local function phase_rows()
  local label = require("fuse.metrics").label
  local rows = {}
  rows[#rows + 1] = { "walk (name_of, still closure)", (cpu(function()
    walk(function(h, _, id) return B.id(h) ~= id end)
  end)) }
  local all = {}
  rows[#rows + 1] = { "walk + peek into a table each", (cpu(function()
    walk(function(h, nm, id)
      local s = {}
      B.peek(h, s)
      if B.id(h) == id then all[#all + 1] = { nm, s } end
    end)
  end)) }
  local labels = {}
  rows[#rows + 1] = { "label() of every name", (cpu(function()
    for i, r in ipairs(all) do labels[i] = label(r[1]) end
  end)) }
  local FIELDS = { "state", "calls", "failure_rate", "failures_total", "successes_total", "failures_total",
    "slow_total", "rejections_total", "opens_total", "running", "full_total" }
  local out = {}
  rows[#rows + 1] = { "11 x N lines with ('%s{name=\"%s\"} %.17g\\n'):format", (cpu(function()
    for _, f in ipairs(FIELDS) do
      for i, r in ipairs(all) do
        out[#out + 1] = ('%s{name="%s"} %.17g\n'):format("fuse_x", labels[i], r[2][f])
      end
    end
  end)) }
  rows[#rows + 1] = { "table.concat of those lines", (cpu(function() return table.concat(out) end)) }
  return rows
end

local load0 = stats.loadavg()
print(("fuse.metrics(), %s, %s registry, %d rounds (CPU seconds of this process, median), load %s")
  :format(jit and jit.version or _VERSION, shared and "shared" or "private", ROUNDS, load0))
for _, size in ipairs{ 1000, 10000, 100000 } do
  grow_to(size)
  local times = {}
  do  -- (the texts are not kept through the timed rounds)
    local texts = {}
    for k, f in ipairs(formatters) do times[k], texts[k] = {}, f[2]() end
    for k = 2, #formatters do
      assert(texts[k] == texts[1], ("bench/metrics.lua: %s and %s differ at %d breakers")
        :format(formatters[1][1], formatters[k][1], size))
    end
  end
  local whole = {}
  for k = 1, #formatters do whole[k] = {} end
  for r = 1, ROUNDS do
    for j = 1, #formatters do
      local k = (r % 2 == 0) and (#formatters + 1 - j) or j  -- the order swapped each round
      collectgarbage()
      times[k][r] = cpu(formatters[k][2])
      whole[k][r] = times[k][r] + cpu(collectgarbage)
    end
  end
  print(("%7d breakers, %d bytes of text"):format(size, #formatters[1][2]()))
  for _, row in ipairs{ { "the call", times }, { "the call + collecting", whole } } do
    local line, m = ("    %-22s"):format(row[1]), {}
    for k, f in ipairs(formatters) do
      m[k] = stats.median(row[2][k])
      line = line .. ("  %s %.3f s"):format(f[1], m[k])
    end
    if #formatters == 2 then line = line .. ("  ratio %.1fx"):format(m[1] / m[2]) end
    print(line)
  end
  if phases then
    for _, r in ipairs(phase_rows()) do print(("    %-52s %.3f s"):format(r[1], r[2])) end
  end
end
print(("load %s at the start, %s at the end"):format(load0, stats.loadavg()))
