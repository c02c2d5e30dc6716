-- fuse.metrics() under OpenResty gives the worker back while it scrapes: in a phase that
-- may yield (rewrite, access, content, timer) it calls ngx.sleep(PAUSE) every YIELD_EVERY
-- breakers of its walk and every 8 * YIELD_EVERY lines it writes, so that the worker
-- serves its other requests meanwhile (at 100,000 breakers a scrape is about 0.3 s of
-- CPU). Here ngx is a stand-in whose sleep yields the coroutine running the scrape; the
-- text must be the one a scrape that never yields writes, and stay right when breakers
-- are removed, made and forced open while it yields. test/scrape.t.sh shows the same in
-- a real nginx.
local support = require "spec.support"
local BACKEND = support.BACKEND

-- Each check runs in a process of its own (a registry sized for several YIELD_EVERY
-- breakers); it prints "ok WHAT" or "not ok WHAT: why" lines.
local PRELUDE = [[
local fuse = require "fuse"
local metrics = require "fuse.metrics"
local EVERY = metrics.YIELD_EVERY
fuse.init{ capacity = 16384 }
local function check(cond, what) io.write(cond and "ok " or "not ok ", what, "\n") end

-- fuse.metrics() (fuse.metrics_chunks(chunk_fn) when given) in `phase` under a stand-in
-- ngx, in a coroutine that `at_yield(k)` resumes after its k-th ngx.sleep. Returns the
-- text (true for metrics_chunks) and the number of yields. Each
-- sleep must be of more than 0 s: ngx.sleep(0) of an nginx without OpenResty's patch
-- resumes the scrape before the worker's other events.
local function scrape(phase, at_yield, chunk_fn)
  local yields, slept = 0, {}
  rawset(_G, "ngx", {
    get_phase = function() return phase end,
    sleep = function(s) slept[#slept + 1] = s; coroutine.yield("slept") end,
  })
  local co = coroutine.create(chunk_fn and fuse.metrics_chunks or fuse.metrics)
  local ok, text = coroutine.resume(co, chunk_fn)
  while ok and text == "slept" do
    yields = yields + 1
    if at_yield then at_yield(yields) end
    ok, text = coroutine.resume(co)
  end
  rawset(_G, "ngx", nil)
  assert(ok, text)
  for _, s in ipairs(slept) do assert(s == metrics.PAUSE and s > 0, "ngx.sleep(" .. tostring(s) .. ")") end
  return text, yields
end

-- name -> value of series `metric` in `text`, and whether a name showed twice there.
local function series(text, metric)
  local out, twice = {}, false
  for name, v in text:gmatch("\n" .. metric .. '{name="([^"]*)"} ([^\n]*)') do
    if out[name] then twice = true end
    out[name] = v
  end
  return out, twice
end

local N = 3 * EVERY + 500
for i = 1, N do fuse.new{ name = ("scrape-%05d"):format(i), fails = 5 } end
]]

local function assert_child(body, count) support.assert_child(PRELUDE .. body, count) end

describe("fuse.metrics() under OpenResty #" .. BACKEND, function()
  support.it_runs_on_backend()

  it("yields every YIELD_EVERY breakers in content, timer, access and rewrite, with the same text", function()
    assert_child([[
local plain = fuse.metrics()  -- no ngx: in one go
for _, phase in ipairs{ "content", "timer", "access", "rewrite" } do
  local text, yields = scrape(phase)
  -- the walk yields once per EVERY breakers (N of them); the writing adds its own
  check(yields >= math.floor(N / EVERY), phase .. ": " .. yields .. " yields for " .. N .. " breakers")
  check(text == plain, phase .. ": the text of a scrape that does not yield")
end
]], 8)
  end)

  it("runs in one go in the phases that cannot yield, and without ngx.sleep", function()
    assert_child([[
local plain = fuse.metrics()
for _, phase in ipairs{ "init", "init_worker", "set", "header_filter", "body_filter", "log", "balancer" } do
  local text, yields = scrape(phase)
  check(yields == 0 and text == plain, phase .. ": no yield (" .. yields .. "), the same text")
end
rawset(_G, "ngx", { get_phase = function() return "content" end })  -- (no sleep)
check(fuse.metrics() == plain, "an ngx without sleep: the same text")
rawset(_G, "ngx", nil)
]], 8)
  end)

  it("stays right when breakers are removed, made and forced open while it yields", function()
    assert_child([[
-- at the first yield the walk has read about EVERY breakers, in slot order: the first
-- names are behind it, the last ones ahead of it
local behind, ahead, again, forced = "scrape-00001", ("scrape-%05d"):format(N), ("scrape-%05d"):format(N - 1),
  ("scrape-%05d"):format(N - 2)
local made = {}
local text, yields = scrape("content", function(k)
  if k ~= 1 then return end
  fuse.remove(again)
  fuse.new{ name = again, fails = 5 }      -- the same name again
  fuse.remove(behind)
  fuse.remove(ahead)
  fuse.get(forced):force_open()
  for i = 1, 3 do made[i] = "scrape-new-" .. i; fuse.new{ name = made[i], fails = 5 } end
end)
check(yields >= 3, "it yielded (" .. yields .. ")")
local state, twice = series(text, "fuse_state")
check(not twice, "one fuse_state line per name")
check(state[ahead] == nil, "a breaker removed before the walk reached it is not shown")
check(state[behind] == "0", "a breaker read before its removal is shown as it was read")
check(state[forced] == "3", "a breaker forced open before the walk reached it shows forced_open")
-- (`again`, removed and made again, and the names made meanwhile may be shown or not,
-- each once: the twice check above)
local kept = 0
for name in pairs(state) do
  if name:find("^scrape%-%d") and name ~= again and name ~= behind then kept = kept + 1 end
end
check(kept == N - 3, "every breaker that lived through the scrape shown (" .. kept .. " of " .. (N - 3) .. ")")
for _, metric in ipairs{ "fuse_calls_total", "fuse_opens_total", "fuse_full_total" } do
  local values, twice_here = series(text, metric)
  local same = not twice_here
  for name in pairs(state) do same = same and values[name] ~= nil end
  for name in pairs(values) do same = same and state[name] ~= nil end
  check(same, metric .. ": one line for each name of fuse_state, and no other")
end
local after = series(fuse.metrics(), "fuse_state")
local first, last = made[1], made[3]
check(after[ahead] == nil and after[behind] == nil and after[first] == "0" and after[last] == "0",
  "the next scrape shows the registry as it is")
]], 10)
  end)

  it("metrics_chunks hands the same text in parts, one before each yield of the writing", function()
    assert_child([[
local plain = fuse.metrics()
local LINES = 8 * EVERY  -- a part's lines (the last: the rest)
-- the events of a scrape by fuse.metrics_chunks in `phase`: "part" (its text kept in
-- parts) and "yield", in order
local function chunks(phase)
  local parts, events = {}, {}
  local fn = function(text) parts[#parts + 1] = text; events[#events + 1] = "part" end
  local text, yields = scrape(phase, function() events[#events + 1] = "yield" end, fn)
  return parts, events, text, yields
end
local parts, events, text, yields = chunks("content")
check(text == true, "it returns true")
check(table.concat(parts) == plain, "content: the parts joined are fuse.metrics()' text")
local lines = select(2, plain:gsub("\n", "\n"))
-- every part but the last ends at a multiple of LINES of the breakers' lines, the HELP
-- and TYPE lines aside (2 per series)
local whole_parts = math.floor((lines - 2 * 11 - 6) / LINES)
check(#parts == whole_parts + 1 and #parts >= 5, "content: " .. #parts .. " parts for " .. lines .. " lines")
local most = 0
for _, p in ipairs(parts) do most = math.max(most, select(2, p:gsub("\n", "\n"))) end
check(most <= LINES + 2 * 11 + 6, "content: at most " .. (LINES + 28) .. " lines in a part (" .. most .. ")")
-- after the walk's yields: part, yield, part, yield, ..., the last part
local writing = table.concat(events, " ", #events - 2 * whole_parts)
check(writing == ("part yield "):rep(whole_parts) .. "part", "content: each part before its yield: " .. writing)
check(yields == #events - #parts, "content: the yields are the stand-in's")
for _, phase in ipairs{ "header_filter", "log" } do
  local p2, e2 = chunks(phase)
  check(table.concat(p2) == plain and #p2 == #parts and not table.concat(e2, " "):find("yield"),
    phase .. ": the same parts, without yielding")
end
local p3 = {}
fuse.metrics_chunks(function(t) p3[#p3 + 1] = t end)
check(table.concat(p3) == plain and #p3 == #parts, "without ngx: the same parts")
check(not pcall(fuse.metrics_chunks, "print"), "a string is not a function")
-- fn's nil and an error (ngx.print's once the client has gone) stops the scrape there
local calls = 0
local ok, err = fuse.metrics_chunks(function()
  calls = calls + 1
  if calls == 2 then return nil, "closed" end
  return 1
end)
check(ok == nil and err == "closed" and calls == 2,
  "fn's nil, err stops it: " .. tostring(ok) .. ", " .. tostring(err) .. " after " .. calls .. " parts")
check(fuse.metrics() == plain, "and the next scrape is whole")
]], 12)
  end)

  it("keeps its tables for the next scrape: one in another's yield, and one of fewer breakers, are right", function()
    assert_child([[
local plain = fuse.metrics()
local inner
local text = scrape("content", function(k)
  if k ~= 2 then return end
  local stand_in = rawget(_G, "ngx")
  rawset(_G, "ngx", nil)
  inner = fuse.metrics()  -- (in one go: begins and ends while the other yields)
  rawset(_G, "ngx", stand_in)
end)
check(text == plain, "a scrape with another in its yield: the text")
check(inner == plain, "the scrape in the other's yield: the text")
for i = 1, N, 2 do fuse.remove(("scrape-%05d"):format(i)) end
local fewer = scrape("content")
local state, twice = series(fewer, "fuse_state")
local shown, odd = 0, 0
for name in pairs(state) do
  shown = shown + 1
  if tonumber(name:match("%d+")) % 2 == 1 then odd = odd + 1 end
end
check(not twice and shown == N - math.ceil(N / 2) and odd == 0,
  "after removing half: " .. shown .. " names, " .. odd .. " of them removed")
check(select(2, fewer:gsub("\n", "\n")) == 11 * (shown + 2) + 6, "after removing half: no other line")
]], 4)
  end)

  it("leaves the walk compiled: no function of fuse blacklisted after scrapes that yield", function()
    if not jit then return pending("LuaJIT only") end
    assert_child([[
local jit_support = require "spec.jit_support"
for _ = 1, 300 do scrape("content") end
for _ = 1, 100 do scrape("content", nil, function() end) end  -- (fuse.metrics_chunks)
local bad = jit_support.blacklisted(jit_support.fuse_roots())
check(#bad == 0, #bad .. " blacklisted entries or loops in fuse's functions: " .. table.concat(bad, ", "))
]], 1)
  end)
end)
