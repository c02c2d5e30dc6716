-- count_window = N: the window is the last N calls, whatever time they took.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

describe("fuse #" .. BACKEND, function()
  local clock = support.fake_clock(1000, 1000)

  local outcome, succeed, fail = support.outcome, support.succeed, support.fail

  support.it_runs_on_backend()

  describe("fails rule", function()
    it("counts only the failures among the last N calls", function()
      local b = fuse.new{ count_window = 5, fails = 3 }
      fail(b, 2)
      succeed(b, 3)                             -- [F F S S S]
      local s = b:stats()
      assert.equal(5, s.calls)
      assert.equal(2, s.failures)
      succeed(b)                                -- [F S S S S]
      assert.equal(5, b:stats().calls)
      assert.equal(1, b:stats().failures)
      succeed(b)                                -- [S S S S S]
      assert.equal(0, b:stats().failures)
      fail(b, 2)                                -- 2 failures in the last 5
      assert.equal("closed", b:state())
      fail(b)                                   -- the third
      assert.equal("open", b:state())
    end)

    it("does not open when the failures are spread wider than N calls", function()
      local b = fuse.new{ count_window = 4, fails = 2 }
      for _ = 1, 10 do                          -- F S S S F S S S ...: never 2 in 4
        fail(b)
        succeed(b, 3)
      end
      assert.equal("closed", b:state())
      assert.equal(10, b:stats().failures_total)
      fail(b)
      succeed(b)
      fail(b)                                   -- [S F S F]
      assert.equal("open", b:state())
    end)

    it("slides call by call: stats follow a model of the last N outcomes", function()
      local N = 8
      local b = fuse.new{ count_window = N, fails = N }
      local pattern = "FFSFSSSFFFSFFSSFFFFSSSSSSFSFSSFFFFFFFS"
      local last = {}
      for i = 1, #pattern do
        local ok = pattern:sub(i, i) == "S"
        outcome(b, ok)
        last[#last + 1] = ok
        if #last > N then table.remove(last, 1) end
        local failures = 0
        for _, v in ipairs(last) do
          if not v then failures = failures + 1 end
        end
        local s = b:stats()
        assert.equal("closed", s.state)
        assert.equal(#last, s.calls, "calls after call " .. i)
        assert.equal(failures, s.failures, "failures after call " .. i)
        assert.near(failures / #last, s.failure_rate, 1e-12)
      end
    end)
  end)

  describe("failure_rate", function()
    it("is computed over the last N calls only", function()
      local b = fuse.new{ count_window = 4, failure_rate = 0.5, min_calls = 4 }
      fail(b)
      succeed(b, 3)                             -- [F S S S] 0.25
      assert.near(0.25, b:stats().failure_rate, 1e-12)
      succeed(b)                                -- [S S S S] 0
      assert.equal(0, b:stats().failure_rate)
      fail(b)                                   -- [S S S F] 0.25
      assert.equal("closed", b:state())
      fail(b)                                   -- [S S F F] 0.5 (3/7 over every call)
      assert.equal("open", b:state())
    end)

    it("needs min_calls calls in the count window", function()
      local b = fuse.new{ count_window = 6, failure_rate = 0.5, min_calls = 4 }
      fail(b, 3)
      assert.equal("closed", b:state())
      assert.equal(3, b:stats().calls)
      fail(b)
      assert.equal("open", b:state())
    end)

    it("can trip with min_calls equal to count_window once the window is full", function()
      local b = fuse.new{ count_window = 3, failure_rate = 1, min_calls = 3 }
      fail(b, 2)
      assert.equal("closed", b:state())
      fail(b)
      assert.equal("open", b:state())
    end)
  end)

  describe("slow_rate", function()
    it("is computed over the last N calls only", function()
      local b = fuse.new{ count_window = 4, slow = 1, slow_rate = 0.5, min_calls = 4 }
      local function call(seconds) outcome(b, true, seconds) end
      call(2); call(0.1); call(0.1); call(0.1)  -- [slow . . .] 0.25
      assert.equal(1, b:stats().slow)
      call(0.1)                                 -- the slow one slides out
      assert.equal(0, b:stats().slow)
      call(1)                                   -- [. . . slow] 0.25
      assert.equal("closed", b:state())
      call(3)                                   -- [. . slow slow] 0.5
      assert.equal("open", b:state())
    end)
  end)

  describe("time", function()
    it("does not expire outcomes in a count window (fails rule)", function()
      local b = fuse.new{ count_window = 5, fails = 3, window = 1 }
      fail(b, 2)
      clock:advance(100000)
      local s = b:stats()
      assert.equal(2, s.calls)
      assert.equal(2, s.failures)
      fail(b)
      assert.equal("open", b:state())
    end)

    it("does not expire outcomes in a count window (rate rule)", function()
      local b = fuse.new{ count_window = 4, failure_rate = 0.5, min_calls = 4 }
      fail(b, 2)
      succeed(b)
      clock:advance(100000)
      succeed(b)                                -- [F F S S] 0.5
      assert.equal("open", b:state())
    end)
  end)

  describe("closing", function()
    it("starts a fresh count window (fails rule)", function()
      local b = fuse.new{ count_window = 5, fails = 3, open_for = 10 }
      fail(b, 3)
      assert.equal("open", b:state())
      clock:advance(10.5)
      assert.equal("half_open", b:state())
      succeed(b)                                -- the probe closes it
      assert.equal("closed", b:state())
      local s = b:stats()
      assert.equal(0, s.calls)
      assert.equal(0, s.failures)
      fail(b, 2)
      assert.equal("closed", b:state())
      fail(b)
      assert.equal("open", b:state())
    end)

    it("starts a fresh count window (rate rule)", function()
      local b = fuse.new{ count_window = 4, failure_rate = 0.5, min_calls = 4, open_for = 5 }
      succeed(b, 2)
      fail(b, 2)                                -- [S S F F]
      assert.equal("open", b:state())
      clock:advance(6)
      succeed(b)                                -- probe
      assert.equal("closed", b:state())
      assert.equal(0, b:stats().calls)
      fail(b, 3)                                -- 3 calls < min_calls: with the old
      assert.equal("closed", b:state())         -- outcomes kept it would be open
      assert.equal(3, b:stats().calls)
    end)

    it("starts a fresh count window after reset()", function()
      local b = fuse.new{ count_window = 5, fails = 3 }
      fail(b, 2)
      b:reset()
      assert.equal(0, b:stats().failures)
      fail(b, 2)
      assert.equal("closed", b:state())
    end)
  end)
end)
