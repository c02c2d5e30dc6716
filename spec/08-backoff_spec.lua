-- backoff, max_open_for and jitter: how long each open period lasts.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

local unpack = table.unpack or unpack  -- luacheck: ignore 143

describe("fuse #" .. BACKEND, function()
  local clock = support.fake_clock(1000, 100000)

  local outcome = support.outcome

  -- The circuit is open now; check it stays open until just before `period` seconds
  -- from now and admits probes just after, leaving the clock at that point.
  local function expect_open_for(b, period)
    assert.equal("open", b:state())
    assert.near(period, b:stats().retry_after, 1e-6)
    local start = clock.now
    clock.now = start + period - 0.01
    assert.equal("open", b:state())
    clock.now = start + period + 0.01
    assert.equal("half_open", b:state())
  end

  support.it_runs_on_backend()

  describe("backoff", function()
    it("multiplies the open period on each failed probe, up to max_open_for", function()
      local b = fuse.new{ fails = 1, open_for = 10, backoff = 2, max_open_for = 35 }
      outcome(b, false)
      expect_open_for(b, 10)
      outcome(b, false)                         -- failed probe
      expect_open_for(b, 20)
      outcome(b, false)
      expect_open_for(b, 35)                    -- 40, capped
      outcome(b, false)
      expect_open_for(b, 35)                    -- stays at the cap
    end)

    it("resets the open period when the circuit closes", function()
      local b = fuse.new{ fails = 1, open_for = 10, backoff = 3 }
      outcome(b, false)
      expect_open_for(b, 10)
      outcome(b, false)
      expect_open_for(b, 30)
      outcome(b, false)
      expect_open_for(b, 90)
      outcome(b, true)                          -- the probe closes it
      assert.equal("closed", b:state())
      outcome(b, false)
      expect_open_for(b, 10)
      outcome(b, false)
      expect_open_for(b, 30)
    end)

    it("resets the open period on reset()", function()
      local b = fuse.new{ fails = 1, open_for = 10, backoff = 2 }
      outcome(b, false)
      expect_open_for(b, 10)
      outcome(b, false)
      expect_open_for(b, 20)
      b:reset()
      assert.equal("closed", b:state())
      outcome(b, false)
      expect_open_for(b, 10)
    end)

    it("keeps a constant open period with the default backoff = 1", function()
      local b = fuse.new{ fails = 1, open_for = 4 }
      outcome(b, false)
      for _ = 1, 5 do
        expect_open_for(b, 4)
        outcome(b, false)
      end
    end)

    it("caps at open_for * 32 by default", function()
      local b = fuse.new{ fails = 1, open_for = 1, backoff = 2 }
      outcome(b, false)
      for _, period in ipairs{ 1, 2, 4, 8, 16, 32, 32, 32 } do
        expect_open_for(b, period)
        outcome(b, false)
      end
    end)

    it("applies to a probe that times out (it counts as failed)", function()
      local b = fuse.new{ fails = 1, open_for = 10, backoff = 2, probe_timeout = 1 }
      outcome(b, false)
      expect_open_for(b, 10)
      local probe = b:allow()
      assert.is_number(probe)
      clock:advance(1.001)                      -- the probe is overdue
      assert.equal("open", b:state())
      -- 20 s from when the timeout was due or was seen (1 ms apart)
      local ra = b:stats().retry_after
      assert.is_true(ra > 19.9 and ra <= 20 + 1e-6, "retry_after " .. ra)
      b:report(probe, true)                     -- late: ignored, does not close
      assert.equal("open", b:state())
      clock:advance(20.01)
      assert.equal("half_open", b:state())
    end)

    it("times a probe out even after the clock jumped weeks ahead (suspended VM)", function()
      for _, jump in ipairs{ 3600, 86400 * 20, 86400 * 25, 86400 * 30, 86400 * 45 } do
        local b = fuse.new{ fails = 1, open_for = 10, probe_timeout = 1 }
        outcome(b, false)
        clock:advance(10.01)
        assert.is_number((b:allow()))             -- the probe never reports
        clock:advance(jump)
        assert.equal("open", b:state(), "probe still holds the circuit after " .. jump .. " s")
        clock:advance(10.01)
        assert.is_number((b:allow()), "no probe admitted after " .. jump .. " s")
      end
    end)

    it("re-opens with backoff when one of several probes fails", function()
      local b = fuse.new{ fails = 1, open_for = 10, backoff = 2, probes = 3 }
      outcome(b, false)
      expect_open_for(b, 10)
      outcome(b, true)
      outcome(b, true)
      assert.equal("half_open", b:state())
      outcome(b, false)
      expect_open_for(b, 20)
    end)
  end)

  describe("jitter", function()
    local function trip_many(n, opts)
      local list = {}
      for i = 1, n do
        list[i] = fuse.new(opts)
        outcome(list[i], false)
        assert.equal("open", list[i]:state())
      end
      return list
    end

    it("shortens each open period by at most j, and not always by the same", function()
      local n, open_for, j = 300, 10, 0.5
      local t0 = clock.now
      local list = trip_many(n, { fails = 1, open_for = open_for, jitter = j })
      local seen, distinct, periods = {}, 0, {}
      for i, b in ipairs(list) do
        local ra = b:stats().retry_after
        periods[i] = ra
        assert.is_true(ra <= open_for + 1e-6, "longer than open_for: " .. ra)
        assert.is_true(ra >= open_for * (1 - j) - 1e-6, "shorter than open_for*(1-j): " .. ra)
        if not seen[ra] then seen[ra], distinct = true, distinct + 1 end
      end
      assert.is_true(distinct > 1, "every open period was the same")

      -- the transition follows retry_after: at the median, the shorter ones admit probes
      local sorted = { unpack(periods) }
      table.sort(sorted)
      local median = sorted[n / 2]
      clock.now = t0 + median
      for i, b in ipairs(list) do
        if periods[i] < median - 1e-3 then
          assert.equal("half_open", b:state())
        elseif periods[i] > median + 1e-3 then
          assert.equal("open", b:state())
        end
      end
      clock.now = t0 + open_for + 0.001
      for _, b in ipairs(list) do
        assert.equal("half_open", b:state())
      end
    end)

    it("never makes a period shorter than open_for*(1-j) (state view)", function()
      local n, j = 200, 0.9
      local t0 = clock.now
      local list = trip_many(n, { fails = 1, open_for = 10, jitter = j })
      clock.now = t0 + 10 * (1 - j) - 0.001
      for _, b in ipairs(list) do
        assert.equal("open", b:state())
      end
      clock.now = t0 + 10.001
      for _, b in ipairs(list) do
        assert.equal("half_open", b:state())
      end
    end)

    it("applies to backed-off periods too", function()
      local n, j = 100, 0.5
      local list = trip_many(n, { fails = 1, open_for = 10, backoff = 2, jitter = j })
      clock:advance(10.001)
      local seen, distinct = {}, 0
      for _, b in ipairs(list) do
        outcome(b, false)                       -- failed probe: 20 s, jittered
        local ra = b:stats().retry_after
        assert.is_true(ra <= 20 + 1e-6 and ra >= 20 * (1 - j) - 1e-6, "period " .. ra)
        if not seen[ra] then seen[ra], distinct = true, distinct + 1 end
      end
      assert.is_true(distinct > 1, "every open period was the same")
    end)

    it("leaves every period exact with jitter = 0", function()
      local list = trip_many(50, { fails = 1, open_for = 10, jitter = 0 })
      for _, b in ipairs(list) do
        assert.near(10, b:stats().retry_after, 1e-6)
      end
    end)
  end)
end)
