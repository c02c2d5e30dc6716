-- A long-lived process keeps the guarded call compiled. Request handlers often run
-- interpreted, and a gateway has thousands of call sites: LuaJIT then starts traces at
-- the entries of the functions they call, and blacklists an entry whose traces keep
-- aborting; from then on every guarded call runs interpreted (20 times slower) for the
-- rest of the process. So: after 100,000 guarded calls made from interpreted code, and
-- after 2,000 distinct call sites, no function of fuse is blacklisted, and a hot loop
-- over a guarded call still compiles into one clean trace.
local fuse = require "fuse"
local support = require "spec.support"

if support.ffi_only("the JIT specs") then return end

local jit_support = require "spec.jit_support"
local jutil = require "jit.util"

local INTERPRETED_CALLS = 100000
local CALL_SITES = 2000
local SITE_ITERATIONS = 60  -- a call site's loop runs about as long as LuaJIT's hotloop

local function add(a, b) return a + (b or 1) end
local function failing() return nil, "down" end
local function raising() error("boom", 0) end

-- The paths of a guarded call, each as a function(i) making one call or one two-step
-- call, over breakers that stay in the state the path needs. `clock` is the spec's fake
-- clock; the half-open path moves it.
local function paths(clock)
  local p, keep = {}, {}
  local function path(name, fn, ...) p[#p + 1] = { name = name, fn = fn }; keep[#keep + 1] = { ... } end

  local g1, b1 = fuse.wrap(add, { fails = 5 })
  path("closed", function(i) return g1(i) end, g1, b1)

  local g2, b2 = fuse.wrap(add, { name = "s12-named", fails = 5, fallback = function() return 0 end })
  path("closed, named, with a fallback", function(i) return g2(i, 2) end, g2, b2)

  local g3, b3 = fuse.wrap(failing, { fails = 1000000, fallback = function(_, x) return x end })
  path("failure (nil, err) to the fallback", function(i) return g3(i) end, g3, b3)

  local g4, b4 = fuse.wrap(failing, { fails = 1000000 })
  path("failure (nil, err), no fallback", function(i) return g4(i) end, g4, b4)

  local g5, b5 = fuse.wrap(raising, { fails = 1000000 })
  path("raised error, re-raised", function(i) return pcall(g5, i) end, g5, b5)

  local g6, b6 = fuse.wrap(raising, { fails = 1000000, fallback = 7 })
  path("raised error, fallback value", function(i) return g6(i) end, g6, b6)

  local g7, b7 = fuse.wrap(failing, { fails = 1, open_for = 86400 })
  g7()
  path("rejection, no fallback", function(i)
    local _, rej = g7(i)
    return rej.retry_after, tostring(rej), fuse.is_rejection(rej)
  end, g7, b7)

  local g8, b8 = fuse.wrap(failing, { fails = 1, open_for = 86400, fallback = function(r) return r end })
  g8()
  path("rejection to the fallback", function(i) return g8(i) end, g8, b8)

  local b9 = fuse.new { fails = 5 }
  b9:force_open()
  local g9 = b9:wrap(add)
  path("forced_open rejection", function(i) return g9(i) end, g9, b9)

  local b10 = fuse.new { fails = 5 }
  path("b:call", function(i) return b10:call(add, i, 1) end, b10)

  local b11 = fuse.new { fails = 1000000 }
  path("allow + report", function(i)
    local t = b11:allow()
    b11:report(t, i % 2 == 0, 0.001)
  end, b11)

  local b12 = fuse.new { fails = 1, open_for = 86400 }
  support.fail(b12)
  path("allow, rejected", function() return b12:allow() end, b12)

  local g13, b13 = fuse.wrap(add, { fails = 5, slow = 1, is_failure = function(ok) return not ok end,
    on_state_change = function() end })
  path("slow rule, is_failure, listener", function(i) return g13(i) end, g13, b13)

  local g14, b14 = fuse.wrap(add, { failure_rate = 0.5, min_calls = 10 })
  path("failure_rate rule", function(i) return g14(i) end, g14, b14)

  local g15, b15 = fuse.wrap(add, { count_window = 20 })
  path("count window", function(i) return g15(i) end, g15, b15)

  local g16, b16 = fuse.wrap(add, { fails = 5, fallback = function() return 0 end })
  path("nine arguments", function(i) return g16(i, 1, 2, 3, 4, 5, 6, 7, 8) end, g16, b16)

  -- a trip and a recovery every few calls: open -> half_open (a probe) -> closed
  local up = true
  local g17, b17 = fuse.wrap(function(x) if up then return x end return nil, "down" end,
    { fails = 1, open_for = 1, on_state_change = function() end })
  path("trip, rejection, probe, close", function(i)
    local k = i % 4
    if k == 0 then up = false elseif k == 2 then up = true; clock:advance(2) end
    return g17(i)
  end, g17, b17)

  local b18 = fuse.new { fails = 5 }
  path("state and stats", function() return b18:state(), b18:stats().calls end, b18)

  return p, keep
end

-- the guarded objects of `keep`, flattened, as roots for jit_support.fuse_roots
local function flat(keep)
  local out = {}
  for _, objs in ipairs(keep) do for _, o in ipairs(objs) do out[#out + 1] = o end end
  return out
end

local function assert_none_blacklisted(roots, aborts)
  local bad, n = jit_support.blacklisted(roots)
  assert.is_true(n > 50, ("only %d functions of fuse were found: the walk is broken"):format(n))
  assert.is_true(#bad == 0, ("%d blacklisted entries or loops in fuse's functions:\n  %s\n"
    .. "aborts of traces that started in fuse (%d):\n  %s"):format(#bad, table.concat(bad, "\n  "),
    #aborts, table.concat(aborts, "\n  ", 1, math.min(#aborts, 20))))
end

-- after all that, a fresh hot loop over a guarded call compiles into one clean trace
-- The upvalue `name` of function fn (how the specs reach fuse's local functions), or nil.
local function upvalue(fn, name)
  for i = 1, math.huge do
    local k, v = debug.getupvalue(fn, i)
    if k == nil then return nil end
    if k == name then return v end
  end
end

local function assert_hot_loop_compiles()
  local f, b = fuse.wrap(add, { fails = 5 })
  local sum
  local ev = jit_support.traced(function(n)
    sum = 0
    for i = 1, n do sum = sum + f(i, 1) end
  end)
  local N = jit_support.N
  assert.equal(N * (N + 1) / 2 + N, sum)
  assert.equal("closed", b:state())
  jit_support.assert_compiled(ev)
end

describe("fuse #ffi", function()
  local clock = support.fake_clock(1000)

  support.it_runs_on_backend()

  if not (jit and jit.attach) then
    pending("not running under LuaJIT: no JIT to check")
    return
  end

  it("no function of fuse is blacklisted after 100,000 guarded calls of each kind from interpreted code", function()
    local p, keep = paths(clock)
    -- each path is called from its own caller, which the JIT never compiles
    local callers = {}
    for k, path in ipairs(p) do
      callers[k] = assert(load("local fn = ... return function(i) return fn(i) end",
        "=interpreted<" .. path.name .. ">"))(path.fn)
      jit.off(callers[k])
    end
    local aborts = jit_support.fuse_aborts(function()
      for k = 1, #p do
        local caller = callers[k]
        for i = 1, INTERPRETED_CALLS do caller(i) end
      end
    end)
    assert_none_blacklisted(jit_support.fuse_roots(flat(keep)), aborts)
    assert_hot_loop_compiles()
  end)

  -- The registry walk (fuse.list, the admin endpoint's pages, fuse.metrics) runs once per
  -- scrape, for as long as the process lives. Its loop made a closure per breaker (FNEW,
  -- which LuaJIT does not compile) and the backend's name_of tail-called ffi.string: every
  -- trace that began in them aborted, and LuaJIT blacklisted both.
  it("the registry walk compiles: no trace begun in its loop or in the backend's name_of aborts", function()
    local names = {}
    for i = 1, 50 do
      names[i] = "s12-walk-" .. i
      fuse.new { name = names[i], fails = 5 }
    end
    local each_breaker = upvalue(fuse._page, "each_breaker")  -- (fuse.list walks with _page)
    assert.is_function(each_breaker, "fuse._page has no upvalue each_breaker: the spec needs updating")
    local walk = jutil.funcinfo(each_breaker)
    -- the walk's loop: its lines before the return (a side trace from the loop's exit, once
    -- per walk, records the return into the caller, whose closure's upvalues it cannot
    -- close (UCLO): the caller's business, not the loop's)
    local ret_line = walk.lastlinedefined
    for pc = 1, walk.bytecodes - 1 do
      local op = jit_support.opname(each_breaker, pc)
      if op == "RET1" or op == "RET" then
        ret_line = math.min(ret_line, jutil.funcinfo(each_breaker, pc).currentline)
      end
    end
    local name_of = jutil.funcinfo(require("fuse.ffi").name_of)
    -- the walk from interpreted callers (a scrape's handler) and from a loop of its own
    local list_caller = assert(load("return function() return require('fuse').list() end", "=scrape<list>"))()
    local page_caller = assert(load("return function() return require('fuse')._page(0, 100, 5000, "
      .. "function(n) return n end) end", "=scrape<page>"))()
    jit.off(list_caller)
    jit.off(page_caller)
    local listed = 0
    local aborts = jit_support.fuse_aborts(function()
      for _ = 1, 1000 do listed = #list_caller() end
      for _ = 1, 1000 do page_caller() end
    end)
    assert.is_true(listed >= 50, ("fuse.list() listed %d names, 50 made"):format(listed))
    -- where the aborted traces began: "fuse.lua:LINE" or "ffi.lua:LINE"
    local bad = {}
    for _, a in ipairs(aborts) do
      local file, line = a:match("^trace started at ([%w_]+%.lua):(%d+) ")
      line = tonumber(line)
      local in_loop = file == "fuse.lua" and line > walk.linedefined and line < ret_line
      local in_name_of = file == "ffi.lua" and line >= name_of.linedefined and line <= name_of.lastlinedefined
      if in_loop or in_name_of then bad[#bad + 1] = a end
    end
    assert.is_true(#bad == 0, ("%d aborts of traces begun in the walk's loop (fuse.lua:%d-%d) or name_of "
      .. "(ffi.lua:%d):\n  %s"):format(#bad, walk.linedefined + 1, ret_line - 1, name_of.linedefined,
      table.concat(bad, "\n  ", 1, math.min(#bad, 20))))
    local blacklisted = jit_support.blacklisted(jit_support.fuse_roots())
    assert.is_true(#blacklisted == 0, ("%d blacklisted entries or loops in fuse's functions:\n  %s")
      :format(#blacklisted, table.concat(blacklisted, "\n  ")))
    for _, name in ipairs(names) do fuse.remove(name) end
  end)

  it("no function of fuse is blacklisted after 2,000 distinct call sites", function()
    local p, keep = paths(clock)
    local aborts = jit_support.fuse_aborts(function()
      for site = 1, CALL_SITES do
        local path = p[site % #p + 1]
        -- a call site of its own: a new prototype, with its own loop
        local loop = assert(load(("local fn = ... return function(n) for i = 1, n do fn(i) end end -- %d")
          :format(site), "=site<" .. site .. ">"))(path.fn)
        loop(SITE_ITERATIONS)
      end
    end)
    assert_none_blacklisted(jit_support.fuse_roots(flat(keep)), aborts)
    assert_hot_loop_compiles()
  end)

  -- The log phase and the balancer of requests with retries (those of a sick peer), under
  -- a fake nginx (spec/fake_nginx.lua): pool:log() split the $upstream_* lists with
  -- string.gmatch and judged the tries in a loop over them, and the balancer's retry read
  -- the previous try's header time with gmatch and listed the tried peers in a loop that
  -- ran once: loops that run once or twice per call cannot start a trace ("leaving loop
  -- in root trace"), and LuaJIT blacklisted them (judge_tries' loop within 100,000
  -- requests). (Before the pools of two peers: the walk's check above expects no free
  -- slot in the registry.)
  it("no trace of pool:log() or of the balancer's retry aborts, none is blacklisted, "
    .. "after 100,000 requests with a retry", function()
    local nginx = require("spec.fake_nginx").new()
    local pool = nginx.upstream.new("s12-retries", { "10.0.0.1:1", "10.0.0.1:2" }, { fails = 1000000 })
    local req, var = nginx.req, nginx.var
    -- the functions of those two paths, found through the phases' upvalues (those the
    -- old code had too are required)
    local fns = { log = pool.log, balance = pool.balance }
    fns.log_record = upvalue(pool.log, "log_record")
    fns.judge_tries = fns.log_record and upvalue(fns.log_record, "judge_tries")
    fns.judge = fns.log_record and upvalue(fns.log_record, "judge")
    fns.split = fns.judge_tries and upvalue(fns.judge_tries, "split")
    fns.judge_previous = upvalue(pool.balance, "judge_previous")
    fns.last_value = fns.judge_previous and upvalue(fns.judge_previous, "last_value")
    for _, name in ipairs({ "log_record", "judge_tries", "judge", "split", "judge_previous", "last_value" }) do
      assert.is_function(fns[name], "no function " .. name .. " among the phases' upvalues: the spec needs updating")
    end
    fns.judge_at = upvalue(fns.judge_tries, "judge_at")
    fns.take_value = upvalue(fns.split, "take_value")
    fns.runs = upvalue(fns.split, "runs")
    fns.tried_of = upvalue(pool.balance, "tried_of")
    local ranges = {}  -- linedefined -> { first, last, name }
    for name, fn in pairs(fns) do
      local fi = jutil.funcinfo(fn)
      ranges[#ranges + 1] = { fi.linedefined, fi.lastlinedefined, name }
    end
    local function named(line)
      for _, r in ipairs(ranges) do if line >= r[1] and line <= r[2] then return r[3] end end
    end
    -- each phase called from its own caller, which the JIT never compiles (as nginx does)
    local balance = assert(load("local pool = ... return function() return pool:balance() end",
      "=interpreted<balance>"))(pool)
    local log = assert(load("local pool = ... return function() return pool:log() end", "=interpreted<log>"))(pool)
    jit.off(balance)
    jit.off(log)
    local aborts = jit_support.fuse_aborts(function()
      for i = 1, INTERPRETED_CALLS do
        req.start = 1000 + i / 1000  -- (a request a millisecond)
        req.failure, req.code = nil, nil
        var.upstream_status, var.upstream_header_time, var.upstream_response_time = nil, nil, nil
        balance()
        req.failure, req.code = "failed", 502  -- (no connection: the header time is "-")
        var.upstream_header_time = "- : "
        balance()
        if i % 2 == 0 then
          var.upstream_status, var.upstream_header_time = "502, 200", "-, 0.002"
          var.upstream_response_time = "0.001, 0.002"
        else
          var.upstream_status, var.upstream_header_time = "502, 503", "-, 0.001"
          var.upstream_response_time = "0.001, 0.001"
        end
        log()
      end
    end)
    -- every request had two tries, one on each peer; each reported (the retry's failure
    -- in the balancer, the rest in the log phase)
    assert.equal(2 * INTERPRETED_CALLS, #nginx.set)
    local calls = fuse.get("s12-retries/10.0.0.1:1"):stats().calls + fuse.get("s12-retries/10.0.0.1:2"):stats().calls
    assert.equal(2 * INTERPRETED_CALLS, calls)
    local bad = {}
    for _, b in ipairs(jit_support.blacklisted(jit_support.fuse_roots({ pool, nginx.module }))) do
      local line = tonumber(b:match("^upstream%.lua:(%d+) "))
      if line and named(line) then bad[#bad + 1] = named(line) .. ": " .. b end
    end
    for _, a in ipairs(aborts) do
      local line = tonumber(a:match("^trace started at upstream%.lua:(%d+) "))
      -- (aborts in fuse.upstream only: a trace that returns into its interpreted caller ends
      -- there, the caller's business; resync runs interpreted by design under nginx, and a
      -- trace that reaches it ends there)
      if line and named(line) and a:find(" aborted at upstream%.lua:")
          and not a:find("JIT compilation disabled", 1, true) then
        bad[#bad + 1] = named(line) .. ": " .. a
      end
    end
    assert.is_true(#bad == 0, ("%d blacklisted bytecodes or aborted traces in pool:log()'s and the balancer's "
      .. "retry path:\n  %s"):format(#bad, table.concat(bad, "\n  ", 1, math.min(#bad, 30))))
    pool:close()
  end)

  -- Picks in pools of one to eight peers off their schedule (fuse.upstream's round robin
  -- runs from a fixed cycle while every pick is admitted at the first ask): retries (one
  -- peer tried), slow-start ramps, open peers. Their loops over the peers ran once to
  -- three times per pick, and LuaJIT blacklisted them, and with them rounds, pick_from,
  -- pick_retry, pick and pool:pick (under nginx: the balancer interpreted for the
  -- worker's life): with one or two peers, every retry blacklisted them within 100,000;
  -- with three to five, a retry, a ramp or open peers did in some runs. rounds' loop
  -- around its rounds (entered on every call) got it blacklisted with four or five.
  it("no function of fuse.upstream is blacklisted after 100,000 picks in pools of one to eight peers, "
    .. "with retries, a ramp or open peers", function()
    local upstream = require "fuse.upstream"
    local cases = {
      { name = "s12-retry1", n = 1, retry = 1 },      -- every pick a retry of peer 1
      { name = "s12-retry2", n = 2, retry = 1 },      -- every pick a retry, peer 1 tried
      { name = "s12-every3", n = 2, every = 3 },      -- a first try, then a retry of it every third
      { name = "s12-ramp2", n = 2, ramp = 1 },        -- peer 1 ramping (slow start)
      { name = "s12-open31", n = 3, open = { 1 } },
      { name = "s12-open33", n = 3, open = { 3 } },
      { name = "s12-open312", n = 3, open = { 1, 2 } },
      { name = "s12-ramp3", n = 3, ramp = 2 },
      { name = "s12-retry3", n = 3, retry = 2 },      -- every pick a retry, peer 2 tried
      { name = "s12-every31", n = 3, every = 1 },     -- a first try and a retry of it, every request
      { name = "s12-every11", n = 1, every = 1 },
      { name = "s12-open412", n = 4, open = { 1, 2 } },
      { name = "s12-open44", n = 4, open = { 4 } },
      { name = "s12-open53", n = 5, open = { 3 } },
      -- larger pools, whose loops over the peers are left as loops
      { name = "s12-retry4", n = 4, retry = 2 },
      { name = "s12-every61", n = 6, every = 1 },
      { name = "s12-ramp6", n = 6, ramp = 3 },
      { name = "s12-open8", n = 8, open = { 2, 5, 7 } },
      { name = "s12-retry8", n = 8, retry = 8 },
      -- a retry in three where one untried peer counts failures (not open)
      { name = "s12-retry3f", n = 3, retry = 1, failing = 3 },
      { name = "s12-every3f", n = 3, every = 1, failing = 2 },
    }
    local pools, callers = {}, {}
    for k, c in ipairs(cases) do
      local peers = {}
      for i = 1, c.n do peers[i] = "10.0.0.1:" .. i end
      local pool = upstream.new(c.name, peers, { fails = 1000000, open_for = 600, max_ejected = 1,
        slow_start = c.ramp and 3600 or 0, window = 3600 })
      if c.failing then  -- one failure, counted for the test's length
        local b = fuse.get(c.name .. "/10.0.0.1:" .. c.failing)
        b:report(b:allow(), false)
      end
      for _, i in ipairs(c.open or {}) do fuse.get(c.name .. "/10.0.0.1:" .. i):force_open() end
      if c.ramp then  -- (as a probe that closed the peer: the ramp's start and a new version)
        local store = upstream._stores["fuse_upstream"]  -- (outside nginx: a table of this Lua state)
        store:set("r/" .. c.name .. "/10.0.0.1:" .. c.ramp, fuse.now())
        store:incr("v/" .. c.name, 1)
      end
      pools[k] = pool
      -- called from its own caller, which the JIT never compiles (as nginx calls the balancer)
      callers[k] = assert(load([[
        local pool, retry, every = ...
        local i, tried = 0, retry and { [pool._peers[retry] ] = true }
        return function()
          i = i + 1
          local p, t = pool:pick(tried)
          if t then p.b:report(t, true) end
          if every and i % every == 0 then
            local q, u = pool:pick({ [p] = true })
            if u then q.b:report(u, true) end
          end
          return p.addr
        end]], "=interpreted<" .. c.name .. ">"))(pool, c.retry, c.every)
      jit.off(callers[k])
    end
    local got = {}
    local aborts = jit_support.fuse_aborts(function()
      for k = 1, #cases do
        local counts, caller = {}, callers[k]
        for _ = 1, INTERPRETED_CALLS do
          local addr = caller()
          counts[addr] = (counts[addr] or 0) + 1
        end
        local line = {}
        for i = 1, cases[k].n do line[i] = counts["10.0.0.1:" .. i] or 0 end
        got[k] = table.concat(line, " ")
      end
    end)
    -- (the first tries' peers) a retry goes to the untried peer (to the tried one when
    -- there is no other); open peers are skipped (max_ejected = 1); a ramping peer gets 0.1
    -- of its weight; every third request's retry takes a turn of the round robin
    local N, half = INTERPRETED_CALLS, INTERPRETED_CALLS / 2
    assert.same({ tostring(N), "0 " .. N, "66666 33334", "9091 90909", "0 " .. half .. " " .. half,
      half .. " " .. half .. " 0", "0 0 " .. N, "47619 4762 47619", half .. " 0 " .. half,
      half .. " 0 " .. half, tostring(N), "0 0 50001 49999", "33334 33333 33333 0",
      "25000 25000 0 25000 25000", "33334 0 33333 33333", "16667 16667 16667 16666 16666 16667",
      "19608 19608 1961 19608 19608 19607", "20000 0 20000 20000 0 20000 0 20000",
      "14286 14286 14286 14286 14286 14285 14285 0", "0 100000 0", "33334 33333 33333" }, got)
    assert_none_blacklisted(jit_support.fuse_roots(pools), aborts)
    for _, pool in ipairs(pools) do pool:close() end
  end)

  -- A pool with open peers: a pick whose round robin falls on an open peer goes on to the
  -- others, on almost every pick. With two peers its loops over the peers ran twice, and a
  -- loop that runs twice cannot start a trace ("leaving loop in root trace"): LuaJIT
  -- blacklisted them, and with them pick_from, pick and pool:pick (under nginx
  -- pool:balance: the balancer interpreted for the worker's life). (Last: the pools it
  -- closes leave free slots in the registry, which the walk's check above does not expect.)
  it("no function of fuse.upstream is blacklisted after 100,000 picks in pools of two peers, one open", function()
    local upstream = require "fuse.upstream"
    local pools = {}
    for k, open in ipairs({ 2, 1, false }) do  -- the peer forced open (none: both healthy)
      local name = "s12-pool" .. k
      pools[k] = upstream.new(name, { "10.0.0.1:1", "10.0.0.1:2" }, { fails = 2, open_for = 600 })
      if open then fuse.get(name .. "/10.0.0.1:" .. open):force_open() end
    end
    -- called from its own caller, which the JIT never compiles (as nginx calls the balancer)
    local caller = assert(load("local pool = ... local p, t = pool:pick() if t then p.b:report(t, true) end "
      .. "return p.addr", "=interpreted<pick>"))
    jit.off(caller)
    local firsts = {}
    local aborts = jit_support.fuse_aborts(function()
      for k, pool in ipairs(pools) do
        firsts[k] = 0
        for _ = 1, INTERPRETED_CALLS do
          if caller(pool) == "10.0.0.1:1" then firsts[k] = firsts[k] + 1 end
        end
      end
    end)
    assert.same({ INTERPRETED_CALLS, 0, INTERPRETED_CALLS / 2 }, firsts)
    assert_none_blacklisted(jit_support.fuse_roots(pools), aborts)
    for _, pool in ipairs(pools) do pool:close() end
  end)
end)
