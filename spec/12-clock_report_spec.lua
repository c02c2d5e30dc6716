-- fuse.clock(fn) with a bad clock, and fuse.report_error that is not a function or raises.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

describe("fuse #" .. BACKEND, function()
  support.it_runs_on_backend()

  describe("fuse.clock(fn) with a clock that answers badly", function()
    after_each(function() fuse.clock() end)

    local BAD = {
      ["NaN"] = function() return 0 / 0 end,
      ["inf"] = function() return math.huge end,
      ["a string"] = function() return "1000" end,
      ["nil"] = function() return nil end,
      ["5e9"] = function() return 5e9 end,
      ["an error"] = function() error("clock broke", 0) end,
    }

    for what, bad in pairs(BAD) do
      it("raises for " .. what .. " and leaves the clock it had installed", function()
        local now = 1000
        fuse.clock(function() return now end)
        local b = fuse.new{ fails = 1, open_for = 10 }
        b:call(function() return nil, "down" end)
        assert.equal("open", b:state())

        local ok, err = pcall(fuse.clock, bad)
        assert.is_false(ok)
        assert.matches("clock", tostring(err))

        -- every later call works, on the previous fake clock
        now = 1004
        local stats
        ok, stats = pcall(b.stats, b)
        assert.is_true(ok, tostring(stats))
        assert.near(6, stats.retry_after, 1e-6)
        assert.equal("closed", fuse.new{}:state())
        now = 1010.5
        assert.equal("half_open", b:state())
      end)

      it("raises for " .. what .. " and leaves the real clock when none was installed", function()
        fuse.clock()
        local ok = pcall(fuse.clock, bad)
        assert.is_false(ok)
        local b = fuse.new{ fails = 1 }
        local calls_ok, r = pcall(b.call, b, function() return "x" end)
        assert.is_true(calls_ok, tostring(r))
        assert.equal("x", r)
        assert.equal("closed", b:state())
      end)
    end

    it("a bad reading names the value at the caller's line", function()
      local ok, err = pcall(fuse.clock, function() return 0 / 0 end)
      assert.is_false(ok)
      assert.matches("must return seconds", err, 1, true)
    end)

    -- A clock that goes bad while a guarded call runs (the function moves the test's time
    -- to a bad value): the call is counted and gives back its probe slot and its
    -- max_concurrent permit, then the error is raised. (The outcome's reading raised
    -- before the core was told: the permit stayed held for good, and every later call was
    -- rejected "full".) Not a clock that raises: its error still goes up at once (a pcall
    -- of the clock on the call path makes its traces abort).
    local BAD_VALUES = {}
    for what, bad in pairs(BAD) do
      if what ~= "an error" then BAD_VALUES[what] = bad end
    end
    for what, bad in pairs(BAD_VALUES) do
      it("going bad during a guarded call (" .. what .. ") leaks no permit and no probe slot", function()
        local now, broken = 1000, false
        fuse.clock(function() if broken then return bad() end return now end)
        local b = fuse.new{ fails = 1, open_for = 10, max_concurrent = 1 }
        b:call(function() return nil, "down" end)
        now = 1011
        assert.equal("half_open", b:state())
        local ok, err = pcall(function()
          local r = b:call(function() broken = true; return "fine" end); return r
        end)
        broken = false
        assert.is_false(ok)
        assert.matches("12%-clock_report_spec%.lua:%d+: fuse: the clock function must return seconds", err)
        local s = b:stats()
        assert.equal(0, s.running)
        assert.equal("closed", s.state)  -- the probe's success was counted
        assert.equal("ran", b:call(function() return "ran" end))
      end)
    end
  end)

  describe("fuse.report_error that is not a function, or raises", function()
    local saved_report, saved_stderr
    local written

    before_each(function()
      saved_report, saved_stderr = fuse.report_error, io.stderr
      written = {}
      io.stderr = { write = function(self, ...) -- luacheck: ignore 122
        for i = 1, select("#", ...) do written[#written + 1] = tostring((select(i, ...))) end
        return self
      end }
    end)

    after_each(function()
      fuse.report_error = saved_report
      io.stderr = saved_stderr -- luacheck: ignore 122
    end)

    local REPORTERS = {
      ["a number"] = 42,
      ["a string"] = "log",
      ["a table"] = {},
      ["false"] = false,
      ["a function that raises"] = function() error("reporter broke", 0) end,
    }

    for what, reporter in pairs(REPORTERS) do
      it("is " .. what .. ": the call returns normally, the default reporter has the message", function()
        fuse.report_error = reporter
        local f = fuse.wrap(function() return nil, "x" end, {
          fails = 1, on_state_change = function() error("listener broke", 0) end,
        })
        local ok, r1, r2 = pcall(f)
        assert.is_true(ok, tostring(r1))
        assert.is_nil(r1)
        assert.equal("x", r2)
        local all = table.concat(written)
        assert.matches("listener broke", all, 1, true)
        assert.matches("fuse.report_error failed", all, 1, true)
      end)
    end

    it("a callable table is called like a function", function()
      local got = {}
      fuse.report_error = setmetatable({}, { __call = function(_, msg) got[#got + 1] = msg end })
      local b = fuse.new{ fails = 1, on_state_change = function() error("listener broke", 0) end }
      local ok, err = pcall(b.force_open, b)
      assert.is_true(ok, tostring(err))
      assert.equal(1, #got)
      assert.matches("listener broke", got[1], 1, true)
      assert.equal("", table.concat(written))
    end)
  end)
end)
