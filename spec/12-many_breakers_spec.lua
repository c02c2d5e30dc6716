-- Many breakers (DESIGN.md, "Gateway scale"): fuse.remove, stale objects, idle eviction,
-- a full registry on the request path, fuse.init{ capacity, idle }, reload rules.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

local unique = support.unique_names("s12")

local function ok_fn(x) return x end
local function failing() return nil, "boom" end

local has = support.has

-- Runs `body` in a fresh process with fuse loaded, a fake clock `clock.now` and
-- check(cond, what); returns the lines "ok WHAT" / "not ok WHAT" it printed.
local PRELUDE = [[
local fuse = require "fuse"
local clock = { now = 1000 }
fuse.clock(function() return clock.now end)
local function check(cond, what) io.write(cond and "ok " or "not ok ", what, "\n") end
local function ok_fn(x) return x end
local function failing() return nil, "boom" end
]]

local function assert_child(body, count) support.assert_child(PRELUDE .. body, count) end

describe("many breakers #" .. BACKEND, function()
  local clock = support.fake_clock(1000, 1)

  support.it_runs_on_backend()

  describe("fuse.remove", function()
    it("answers true when the breaker existed, and it is gone from list, get and metrics", function()
      local name = unique("rm")
      fuse.new{ name = name, fails = 2 }
      assert.is_true(has(fuse.list(), name))
      assert.is_true(fuse.remove(name))
      assert.is_false(fuse.remove(name))
      assert.is_false(has(fuse.list(), name))
      assert.is_nil(fuse.get(name))
      assert.is_nil(fuse.metrics():find('name="' .. name .. '"', 1, true))
    end)

    it("answers false for a name never made, and raises for a non-string", function()
      assert.is_false(fuse.remove(unique("never")))
      assert.is_false(fuse.remove(""))
      assert.has_error(function() fuse.remove(42) end, "fuse: fuse.remove needs a name string, got 42")
    end)
  end)

  describe("an object whose breaker was removed", function()
    it("re-creates its name, closed and fresh, with its own options, on its next call", function()
      local name = unique("wrap")
      local g, b = fuse.wrap(failing, { name = name, fails = 2, window = 30 })
      g(); g()
      assert.equal("open", b:state())
      assert.is_true(fuse.remove(name))
      assert.is_nil(fuse.get(name))
      local r, err = g()  -- a call through the old wrap: runs, against a fresh breaker
      assert.is_nil(r)
      assert.equal("boom", err)
      local again = fuse.get(name)
      assert.is_not_nil(again)
      assert.equal(30, again.cfg.window)
      assert.equal(2, again.cfg.fails)
      assert.equal(1, again:stats().failures)
      assert.equal("closed", b:state())
    end)

    it("re-finds it in allow/report and the manual states; state and stats never create it", function()
      local name = unique("obj")
      local b = fuse.new{ name = name, fails = 3 }
      fuse.remove(name)
      assert.equal("closed", b:state())  -- as a fresh breaker, and the name stays gone
      assert.equal(0, b:stats().calls)
      assert.is_false(has(fuse.list(), name))
      support.fail(b, 1)
      assert.equal(1, b:stats().failures)
      fuse.remove(name)
      b:force_open()
      assert.equal("forced_open", fuse.get(name):state())
    end)

    it("finds the breaker another object re-created (one breaker per name)", function()
      local name = unique("two")
      local g1, b1 = fuse.wrap(ok_fn, { name = name, fails = 3 })
      local g2 = fuse.wrap(ok_fn, { name = name, fails = 3 })
      fuse.remove(name)
      assert.equal(1, g1(1))
      assert.equal(2, g2(2))
      assert.equal(2, b1:stats().calls)
    end)

    it("an allow ticket taken before the removal counts nothing after it", function()
      local name = unique("ticket")
      local b = fuse.new{ name = name, fails = 1 }
      local t = assert(b:allow())
      fuse.remove(name)
      b:report(t, false)
      assert.equal("closed", b:state())
      assert.equal(0, b:stats().failures_total)
    end)
  end)

  describe("fuse.metrics", function()
    it("has fuse_registry_full_total and fuse_registry_evictions_total", function()
      local m = fuse.metrics()
      assert.matches("\n# TYPE fuse_registry_full_total counter\nfuse_registry_full_total %d+\n", m)
      assert.matches("\n# TYPE fuse_registry_evictions_total counter\nfuse_registry_evictions_total %d+\n", m)
    end)
  end)

  describe("reload rules", function()
    local saved
    local logged
    before_each(function()
      saved = rawget(_G, "ngx")
      logged = {}
    end)
    after_each(function() rawset(_G, "ngx", saved) end)

    local function fake_ngx(phase)
      rawset(_G, "ngx", { get_phase = function() return phase end, NOTICE = 6,
        log = function(level, msg) logged[#logged + 1] = { level, msg } end })
    end

    it("in init_by_lua*, other numeric options reconfigure the breaker, state and counts kept", function()
      local name = unique("reload")
      local b = fuse.new{ name = name, fails = 5 }
      support.fail(b, 2)
      fake_ngx("init")
      local b2 = fuse.new{ name = name, fails = 3, open_for = 7 }
      assert.equal(3, b2.cfg.fails)
      assert.equal(7, b2.cfg.open_for)
      assert.equal(1, #logged)
      assert.equal(6, logged[1][1])
      assert.matches("fuse: breaker '" .. name .. "' reconfigured (old vs new): fails (5 vs 3), "
        .. "open_for (10 vs 7)", logged[1][2], 1, true)
      rawset(_G, "ngx", saved)
      assert.equal(2, b2:stats().failures)  -- counts kept
      support.fail(b2, 1)                     -- the new threshold applies
      assert.equal("open", b2:state())
    end)

    it("a reload may give a breaker a count window (its ring is there)", function()
      local name = unique("reload-cw")
      local b = fuse.new{ name = name, fails = 5 }
      fake_ngx("init")
      local b2 = fuse.new{ name = name, fails = 2, count_window = 4 }
      rawset(_G, "ngx", saved)
      assert.equal(4, b2.cfg.count_window)
      support.succeed(b2, 3)
      support.fail(b2, 2)
      assert.equal("open", b:state())
    end)

    it("anywhere else a mismatch is still an error", function()
      local name = unique("noreload")
      fuse.new{ name = name, fails = 5 }
      fake_ngx("content")
      assert.has_error(function() fuse.new{ name = name, fails = 3 } end)
    end)
  end)

  -- Scripts in processes of their own: capacity and idle are set before any breaker.
  describe("idle eviction", function()
    it("evicts the least recently used idle breaker when creation finds the registry full", function()
      assert_child([[
        fuse.init{ capacity = 3, idle = 5 }
        local ga, a = fuse.wrap(ok_fn, { name = "a", fails = 3 })
        local gb = fuse.wrap(ok_fn, { name = "b", fails = 3 })
        local gc = fuse.wrap(ok_fn, { name = "c", fails = 3 })
        clock.now = clock.now + 2; gb(1)
        clock.now = clock.now + 2; ga(1); gc(1)
        check(not pcall(fuse.new, { name = "d" }), "nothing idle for 5 s yet: creation raises")
        clock.now = clock.now + 10
        ga(1); gc(1)            -- b is the least recently used
        fuse.new{ name = "d" }
        local l = table.concat(fuse.list(), ",")
        check(not l:find("b", 1, true) and l:find("d", 1, true), "b was evicted for d: " .. l)
        check(fuse.get("b") == nil, "b is gone from fuse.get")
        check(fuse.metrics():find("fuse_registry_evictions_total 1\n", 1, true), "eviction counted")
        clock.now = clock.now + 3
        fuse.get("d"):call(ok_fn, 1)
        clock.now = clock.now + 10
        ga(1)                   -- a used, c and d idle: c is older
        fuse.new{ name = "e" }
        check(fuse.get("c") == nil and fuse.get("a") and fuse.get("d"), "then c, the least recently used")
        check(a:state() == "closed", "a kept")
      ]], 6)
    end)

    it("never evicts open, half_open, forced_open, disabled, or a breaker with failures", function()
      assert_child([[
        fuse.init{ capacity = 5, idle = 1 }
        local go, o = fuse.wrap(failing, { name = "open", fails = 1, open_for = 1000 })
        go()
        local gh, h = fuse.wrap(failing, { name = "half", fails = 1, open_for = 1 })
        gh()
        local f = fuse.new{ name = "forced", fails = 1 }; f:force_open()
        local d = fuse.new{ name = "disabled", fails = 1 }; d:disable()
        local gw = fuse.wrap(failing, { name = "failing", fails = 5, window = 1000 })
        gw()
        clock.now = clock.now + 100
        check(h:state() == "half_open", "half is half_open")
        local ok, err = pcall(fuse.new, { name = "new" })
        check(not ok and tostring(err):find("registry is full", 1, true), "nothing evictable: creation raises")
        check(#fuse.list() == 5, "all five kept")
        check(o:state() == "open", "the open breaker is still open")
      ]], 4)
    end)

    it("never evicts a breaker whose max_concurrent permits are held: its limit holds", function()
      -- (a call that outlives idle: evicted, its name made again fresh, the limit of 1
      -- admitted a second call beside the first)
      assert_child([[
        fuse.init{ capacity = 2, idle = 1 }
        local lim = fuse.new{ name = "lim", fails = 5, max_concurrent = 1 }
        local t1 = lim:allow()
        check(t1 and lim:stats().running == 1, "one call runs, holding the permit")
        fuse.new{ name = "other" }
        clock.now = clock.now + 100
        fuse.new{ name = "third" }  -- evicts the idle breaker without permits held
        local names = table.concat(fuse.list(), " ")
        check(names:find("lim", 1, true) and not names:find("other", 1, true), "lim kept, other evicted: " .. names)
        local t2, rej = lim:allow()
        check(t2 == nil and rej and rej.reason == "full", "a second call is still past the limit")
        lim:report(t1, true)
        clock.now = clock.now + 100
        fuse.new{ name = "fourth" }
        check(not table.concat(fuse.list(), " "):find("lim", 1, true), "its call over, lim is evictable again")
      ]], 4)
    end)

    it("without idle nothing is evicted", function()
      assert_child([[
        fuse.init{ capacity = 2 }
        fuse.new{ name = "a" }; fuse.new{ name = "b" }
        clock.now = clock.now + 1e6
        check(not pcall(fuse.new, { name = "c" }), "full, no idle: creation raises")
      ]], 1)
    end)
  end)

  describe("a full registry on the request path", function()
    it("a call whose breaker is gone and cannot be re-created runs unguarded and is counted", function()
      assert_child([[
        fuse.init{ capacity = 1 }
        local gx, x = fuse.wrap(failing, { name = "x", fails = 1 })
        fuse.remove("x")
        local y = fuse.new{ name = "y", fails = 1 }  -- takes x's slot
        local r, err = gx()
        check(r == nil and err == "boom", "the call ran, unguarded")
        check(y:stats().calls == 0 and y:state() == "closed", "and counted nothing into y (x's old slot)")
        check(fuse.metrics():find("fuse_registry_full_total 1\n", 1, true), "fuse_registry_full_total 1")
        local t = x:allow()
        check(type(t) == "number", "allow answers a ticket that counts nowhere")
        x:report(t, false)
        check(y:stats().failures_total == 0, "y still untouched")
        check(not pcall(fuse.new, { name = "z" }), "a new name still raises")
        y:call(failing)
        check(x:stats().failures == 0 and x:state() == "closed", "x's stats are a fresh breaker's, not y's")
      ]], 7)
    end)

    it("with a slot free again, the object re-creates its own breaker", function()
      assert_child([[
        fuse.init{ capacity = 1 }
        local gx, x = fuse.wrap(failing, { name = "x", fails = 2 })
        fuse.remove("x")
        fuse.new{ name = "y" }
        gx()
        fuse.remove("y")
        gx()
        check(fuse.get("x") and fuse.get("x"):stats().failures == 1, "x is back, counting its own call")
        check(x:state() == "closed", "closed")
      ]], 2)
    end)
  end)

  describe("fuse.init{ capacity }", function()
    it("sizes the process's own registry before any named breaker, and not after", function()
      assert_child([[
        fuse.init{ capacity = 2 }
        fuse.new{ name = "a" }; fuse.new{ name = "b" }
        check(not pcall(fuse.new, { name = "c" }), "capacity 2")
        local ok, err = pcall(fuse.init, { capacity = 10 })
        check(not ok and tostring(err):find("named breakers exist already", 1, true), "too late: " .. tostring(err))
      ]], 2)
    end)
  end)

  it("keeps the fake clock honest", function() assert.is_number(clock.now) end)
end)
