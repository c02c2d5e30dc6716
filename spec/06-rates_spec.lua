-- Rate rules: failure_rate and slow_rate with min_calls, over a time window.
--
-- Reading of DESIGN.md tested here (as Resilience4j does it): a rate rule is evaluated
-- after every recorded outcome, successes included, once the window holds min_calls
-- calls. So the success that brings the window to min_calls opens the circuit when the
-- failure rate is then >= failure_rate.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

describe("fuse #" .. BACKEND, function()
  local clock = support.fake_clock(1000, 1000)

  local succeed, fail = support.succeed, support.fail

  support.it_runs_on_backend()

  describe("failure_rate", function()
    it("opens when the rate equals failure_rate exactly", function()
      local b = fuse.new{ failure_rate = 0.5, min_calls = 4 }
      succeed(b, 2)
      fail(b)
      assert.equal("closed", b:state())
      fail(b)                                   -- 2 / 4 == 0.5
      assert.equal("open", b:state())
    end)

    it("compares failures/calls with r, not failures with r*calls (7 and 14 of 25)", function()
      -- 0.28 * 25 == 7.000000000000001 in doubles while 7 / 25 == 0.28: a rule computed
      -- as failures >= r * calls would miss this exact threshold (0.56 * 25 likewise)
      local b = fuse.new{ failure_rate = 0.28, min_calls = 25 }
      succeed(b, 18)
      fail(b, 6)
      assert.equal("closed", b:state())
      fail(b)                                   -- 7 / 25 == 0.28
      assert.equal("open", b:state())

      local b2 = fuse.new{ failure_rate = 0.56, min_calls = 25 }
      succeed(b2, 11)
      fail(b2, 13)
      assert.equal("closed", b2:state())
      fail(b2)                                  -- 14 / 25 == 0.56
      assert.equal("open", b2:state())
    end)

    it("stays closed one failure under the rate, opens once it is reached", function()
      local b = fuse.new{ failure_rate = 0.5, min_calls = 10 }
      succeed(b, 6)
      fail(b, 4)                                -- 4 / 10
      assert.equal("closed", b:state())
      local s = b:stats()
      assert.equal(10, s.calls)
      assert.equal(4, s.failures)
      assert.near(0.4, s.failure_rate, 1e-12)
      fail(b)                                   -- 5 / 11
      assert.equal("closed", b:state())
      fail(b)                                   -- 6 / 12
      assert.equal("open", b:state())
    end)

    it("opens on the call that reaches min_calls when the rate is above r", function()
      local b = fuse.new{ failure_rate = 0.5, min_calls = 10 }
      succeed(b, 4)
      fail(b, 5)                                -- 9 calls: min_calls not reached
      assert.equal("closed", b:state())
      fail(b)                                   -- 6 / 10 == 0.6 > 0.5
      assert.equal("open", b:state())
    end)

    it("never trips before min_calls, even at 100% failures", function()
      local b = fuse.new{ failure_rate = 0.5, min_calls = 10 }
      fail(b, 9)
      assert.equal("closed", b:state())
      local s = b:stats()
      assert.equal(9, s.calls)
      assert.equal(9, s.failures)
      assert.equal(1, s.failure_rate)
      fail(b)
      assert.equal("open", b:state())
    end)

    it("does not apply the default fails = 5 when only a rate rule is given", function()
      local b = fuse.new{ failure_rate = 0.6, min_calls = 10 }
      succeed(b, 4)
      fail(b, 5)                                -- the default fails rule would trip here
      assert.equal("closed", b:state())
      fail(b)                                   -- 6 / 10
      assert.equal("open", b:state())
    end)

    it("is evaluated after a success too: the success reaching min_calls can open", function()
      local b = fuse.new{ failure_rate = 0.5, min_calls = 4 }
      fail(b, 3)
      assert.equal("closed", b:state())
      succeed(b)                                -- 3 / 4 >= 0.5 once min_calls is reached
      assert.equal("open", b:state())
    end)

    it("applies an explicit fails rule as well: fails trips before min_calls", function()
      local b = fuse.new{ fails = 3, failure_rate = 0.5, min_calls = 10 }
      fail(b, 2)
      assert.equal("closed", b:state())
      fail(b)
      assert.equal("open", b:state())
    end)

    it("applies the rate rule as well when fails is given: the rate trips first", function()
      local b = fuse.new{ fails = 8, failure_rate = 0.5, min_calls = 4 }
      succeed(b, 2)
      fail(b)
      assert.equal("closed", b:state())
      fail(b)                                   -- 2 failures < fails, but 2 / 4 >= 0.5
      assert.equal("open", b:state())
    end)

    it("lets calls and failures expire with the time window", function()
      local b = fuse.new{ failure_rate = 0.5, min_calls = 4, window = 10 }
      fail(b, 3)
      clock:advance(12)                         -- past window * 1.1
      succeed(b)                                -- 0 / 1 now, not 3 / 4
      assert.equal("closed", b:state())
      assert.equal(1, b:stats().calls)
      assert.equal(0, b:stats().failures)

      local b2 = fuse.new{ failure_rate = 0.5, min_calls = 4, window = 10 }
      fail(b2, 3)
      clock:advance(9.9)                        -- still inside the window
      succeed(b2)                               -- 3 / 4
      assert.equal("open", b2:state())
    end)
  end)

  describe("a window that rolls over while a call is in flight", function()
    it("counts the outcome in the window current when it is reported (fails rule)", function()
      local b = fuse.new{ fails = 2, window = 10 }
      fail(b)
      local ticket = assert(b:allow())
      clock:advance(30)                         -- the whole window has rolled over
      assert.equal(0, b:stats().failures)
      b:report(ticket, false)
      local s = b:stats()
      assert.equal("closed", s.state)           -- the old failure expired: 1 < 2
      assert.equal(1, s.calls)
      assert.equal(1, s.failures)
      fail(b)
      assert.equal("open", b:state())
    end)

    it("counts the outcome in the new window (rate rule)", function()
      local b = fuse.new{ failure_rate = 0.5, min_calls = 2, window = 10 }
      succeed(b, 2)
      fail(b)
      local ticket = assert(b:allow())
      clock:advance(30)
      b:report(ticket, false)
      local s = b:stats()
      assert.equal("closed", s.state)           -- 1 call < min_calls
      assert.equal(1, s.calls)
      assert.equal(1, s.failures)
      assert.equal(1, s.failure_rate)
      fail(b)                                   -- 2 / 2
      assert.equal("open", b:state())
    end)
  end)

  describe("slow and slow_rate", function()
    it("counts a call that takes exactly `slow` as slow", function()
      local b = fuse.new{ slow = 0.5 }
      succeed(b, 1, 0.5)
      assert.equal(1, b:stats().slow)
      succeed(b, 1, 0.4999)
      assert.equal(1, b:stats().slow)
      assert.equal(2, b:stats().calls)

      local b2 = fuse.new{ slow = 0.1 }
      succeed(b2, 1, 0.1)
      assert.equal(1, b2:stats().slow)
      succeed(b2, 1, 0.0999)
      assert.equal(1, b2:stats().slow)
    end)

    it("counts a wrapped call that takes exactly `slow` as slow, whatever the clock's origin", function()
      -- durations and origins exact in binary, so the fake clock adds no rounding:
      -- only the library's own conversions could make 1 s read as 0.999...
      for _, d in ipairs{ 1, 2, 0.25 } do
        local f, b = fuse.wrap(function() clock:advance(d) end, { slow = d })
        local missed = {}
        for k = 10, 30 do                       -- 2^k - 1: where s * 1e9 * 1e-9 rounds down
          local origin = 2 ^ k - 1
          if origin > clock.now then
            clock.now = origin
            local before = b:stats().slow_total
            f()
            if b:stats().slow_total ~= before + 1 then missed[#missed + 1] = origin end
          end
        end
        for _ = 1, 1000 do
          clock:advance(1.25)
          local before = b:stats().slow_total
          f()
          if b:stats().slow_total ~= before + 1 then missed[#missed + 1] = clock.now - d end
        end
        assert.same({}, missed, "slow = " .. d .. ": calls of exactly " .. d .. " s not slow")
      end
    end)

    it("opens when slow/calls reaches slow_rate once min_calls were seen", function()
      local b = fuse.new{ slow = 1, slow_rate = 0.5, min_calls = 4 }
      succeed(b, 1, 1)
      succeed(b, 1, 3)
      assert.equal("closed", b:state())         -- 2 / 2, but min_calls not reached
      succeed(b, 1, 0.2)
      assert.equal("closed", b:state())
      local s = b:stats()
      assert.equal(3, s.calls)
      assert.equal(2, s.slow)
      assert.near(2 / 3, s.slow_rate, 1e-12)
      succeed(b, 1, 0.2)                        -- 2 / 4 == 0.5
      assert.equal("open", b:state())
    end)

    it("stays closed one slow call under the rate", function()
      local b = fuse.new{ slow = 1, slow_rate = 0.5, min_calls = 4 }
      succeed(b, 3, 0.1)
      succeed(b, 1, 5)                          -- 1 / 4
      assert.equal("closed", b:state())
      assert.near(0.25, b:stats().slow_rate, 1e-12)
    end)

    it("measures a wrapped call with the clock: time advanced inside fn makes it slow", function()
      local f, b = fuse.wrap(function(d)
        clock:advance(d)
        return "r", d, nil
      end, { slow = 1, slow_rate = 0.5, min_calls = 4 })
      assert.same({ "r", 0 }, { f(0) })
      f(0)
      local n = select("#", f(1))               -- exactly `slow`: slow, results intact
      assert.equal(3, n)
      assert.equal("closed", b:state())
      assert.equal(1, b:stats().slow)
      local r1, r2 = f(2.5)                     -- 2 / 4: a slow success still returns
      assert.equal("r", r1)
      assert.equal(2.5, r2)
      assert.equal("open", b:state())
      local x, rej = f(0)
      assert.is_nil(x)
      assert.is_true(fuse.is_rejection(rej))
    end)

    it("does not apply the default fails = 5 when only slow_rate is given", function()
      local b = fuse.new{ slow = 1, slow_rate = 0.5, min_calls = 20 }
      fail(b, 10)
      assert.equal("closed", b:state())
      assert.equal(10, b:stats().failures)

      local b2 = fuse.new{ slow = 1, slow_rate = 0.5, min_calls = 20, fails = 3 }
      fail(b2, 3)
      assert.equal("open", b2:state())
    end)

    it("counts slow calls in stats.slow and slow_total without a slow_rate", function()
      local b = fuse.new{ slow = 1 }
      succeed(b, 2, 1.5)
      succeed(b, 1, 0.5)
      local s = b:stats()
      assert.equal(3, s.calls)
      assert.equal(2, s.slow)
      assert.equal(2, s.slow_total)
      assert.near(2 / 3, s.slow_rate, 1e-12)
      assert.equal("closed", s.state)

      local f, b2 = fuse.wrap(function() clock:advance(1) end, { slow = 1 })
      f()
      f()
      assert.equal(2, b2:stats().slow)
      assert.equal(2, b2:stats().slow_total)

      clock:advance(100)                        -- the window rolls over; the total stays
      s = b:stats()
      assert.equal(0, s.slow)
      assert.equal(0, s.calls)
      assert.equal(2, s.slow_total)
    end)

    it("counts a slow probe in slow_total", function()
      local b = fuse.new{ fails = 1, slow = 1, open_for = 5 }
      fail(b)
      clock:advance(5.01)
      succeed(b, 1, 3)                          -- a slow probe: closes (no slow_rate)
      local s = b:stats()
      assert.equal("closed", s.state)
      assert.equal(1, s.slow_total)
      assert.equal(1, s.successes_total)
    end)

    it("never counts a call as slow without `slow`, or without a measured duration", function()
      local b = fuse.new{ fails = 5 }
      succeed(b, 1, 1000)
      assert.equal(0, b:stats().slow)
      assert.equal(0, b:stats().slow_total)

      local b2 = fuse.new{ slow = 1 }
      succeed(b2)                               -- report without seconds
      assert.equal(0, b2:stats().slow)
      assert.equal(1, b2:stats().calls)
    end)

    -- Reading: "a call that takes at least this long is slow" has no exception for
    -- failures (Resilience4j counts slow failed calls as slow too).
    it("counts a slow failure as slow too", function()
      local b = fuse.new{ slow = 1 }
      fail(b, 1, 2)
      local s = b:stats()
      assert.equal(1, s.failures)
      assert.equal(1, s.slow)
      assert.equal(1, s.slow_total)
    end)

    it("lets either rate rule open the circuit when both are set", function()
      local b = fuse.new{ slow = 1, slow_rate = 0.5, failure_rate = 0.5, min_calls = 4 }
      succeed(b, 2, 0.1)
      succeed(b, 1, 1)
      fail(b, 1, 0.1)                           -- slow 1/4, failures 1/4
      assert.equal("closed", b:state())
      succeed(b, 1, 2)                          -- slow 2/5
      assert.equal("closed", b:state())
      succeed(b, 1, 2)                          -- slow 3/6
      assert.equal("open", b:state())
    end)
  end)

  describe("the time window", function()
    it("forgets a failure after window * 1.1 seconds, even after a long jump of the clock", function()
      -- window = 0.01: 1 ms buckets; 2^32 ms later a 32-bit bucket number repeats
      for _, jump in ipairs{ 0.012, 100, 4294967.296, 4294967.296 * 2 } do
        local b = fuse.new{ fails = 2, window = 0.01 }
        fail(b)
        clock:advance(jump)
        assert.equal(0, b:stats().failures, "after a jump of " .. jump .. " s")
        fail(b)
        assert.equal("closed", b:state(), "after a jump of " .. jump .. " s")
      end
    end)
  end)
end)
