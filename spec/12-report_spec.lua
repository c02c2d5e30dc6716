-- The two-step form's misuse (issue 7, items 9 and 12): a ticket reported twice, a
-- ticket given to another breaker, a made-up number, bad seconds. Each is refused with
-- an error that says why, at the caller's line, and counts nothing.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

describe("fuse #" .. BACKEND, function()
  local clock = support.fake_clock(1000, 1000)
  support.it_runs_on_backend()

  local function totals(b)
    local s = b:stats()
    return s.successes_total, s.failures_total
  end

  -- the error of f(...), which must raise; and the line it names must be this file's
  local function refusal(f, ...)
    local ok, err = pcall(f, ...)
    assert.is_false(ok, "expected an error")
    return err
  end

  describe("b:report", function()
    it("refuses a ticket reported twice, and counts it once", function()
      local b = fuse.new { fails = 2 }
      local t = b:allow()
      b:report(t, false)
      local err = refusal(b.report, b, t, false)
      assert.matches("^fuse: report: ticket %d+ was already reported", err)
      assert.equal("closed", b:state())  -- one call of fails = 2 never opens
      assert.same({ 0, 1 }, { totals(b) })
      err = refusal(b.report, b, t, true)
      assert.matches("already reported", err)
      assert.same({ 0, 1 }, { totals(b) })
    end)

    it("refuses a ticket of another breaker, which counts nothing there", function()
      local a, b = fuse.new { fails = 1 }, fuse.new { fails = 1 }
      local t = a:allow()
      local err = refusal(b.report, b, t, false)
      assert.matches("^fuse: report: %d+ is not a ticket this breaker's allow issued", err)
      assert.equal("closed", b:state())
      assert.same({ 0, 0 }, { totals(b) })
      a:report(t, true)  -- its own breaker still takes it
      assert.same({ 1, 0 }, { totals(a) })
    end)

    -- (An untracked ticket is checked by its breaker's key, drawn at random from 1 to 8191
    -- into bits 40 and up, its generation and its state: a made-up number that carries b's
    -- key is taken, 1 time in 8191. So the numbers here carry key 0, which no breaker has;
    -- 2^52 + 2 and 7 * 2^40 + 2, here before, failed that often: once in a CI run.)
    it("refuses made-up numbers", function()
      local b = fuse.new { fails = 1 }
      for _, n in ipairs { 2, 130, 3, 2 ^ 39 + 2, 2 ^ 30 + 2 ^ 8 + 2, 2 ^ 40 - 126 } do
        assert.matches("is not a ticket", refusal(b.report, b, n, false))
      end
      assert.equal("closed", b:state())
      assert.same({ 0, 0 }, { totals(b) })
    end)

    it("raises at the caller's line", function()
      local b = fuse.new { fails = 1 }
      local t = b:allow()
      b:report(t, true)
      local line = debug.getinfo(1, "l").currentline + 1
      local ok, err = pcall(function() b:report(t, true) end)
      assert.is_false(ok)
      assert.matches("12%-report_spec%.lua:" .. line .. ": fuse: report", err)
    end)

    it("stays exact under correct use, tickets outstanding at once", function()
      local b = fuse.new { fails = 1000 }
      local ts = {}
      for i = 1, 300 do ts[i] = b:allow() end
      for i = 300, 1, -1 do b:report(ts[i], i % 3 ~= 0) end
      assert.same({ 200, 100 }, { totals(b) })
    end)

    it("refuses a probe's ticket reported twice (no re-open after the close)", function()
      local b = fuse.new { fails = 1, open_for = 1 }
      support.fail(b)
      clock:advance(1)
      local t = b:allow()
      assert.equal("half_open", b:state())
      b:report(t, true)
      assert.equal("closed", b:state())
      assert.matches("already reported", refusal(b.report, b, t, false))
      assert.equal("closed", b:state())
      assert.same({ 1, 1 }, { totals(b) })
    end)

    for _, bad in ipairs { -1, -0.001, math.huge, -math.huge, 0 / 0 } do
      it("refuses seconds = " .. tostring(bad), function()
        local b = fuse.new { fails = 1, slow = 1, slow_rate = 0.5, min_calls = 1 }
        local t = b:allow()
        local err = refusal(b.report, b, t, true, bad)
        assert.matches("^fuse: report's seconds must be a finite number >= 0, got", err)
        b:report(t, true, 0)  -- the ticket was not used up by the refusal
        assert.same({ 1, 0 }, { totals(b) })
        assert.equal(0, b:stats().slow_total)
      end)
    end
  end)
end)
