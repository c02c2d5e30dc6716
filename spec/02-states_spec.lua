-- The state machine: closed -> open -> half_open -> closed/open, the manual states,
-- generations (stale outcomes) and retry_after. Time comes from a fake clock.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

local EPS = 1e-6

describe("fuse #" .. BACKEND, function()
  local clock = support.fake_clock(1000)

  -- a guarded function that fails by the default rule, and one that succeeds;
  -- both count how often they ran
  local ran
  local function failing() ran = ran + 1; return nil, "boom" end
  local function working() ran = ran + 1; return "ok" end
  before_each(function() ran = 0 end)

  local function fail(b, n)
    for _ = 1, n or 1 do b:call(failing) end
  end

  -- an anonymous breaker tripped at the current time
  local function opened(opts)
    local b = fuse.new(opts)
    fail(b, opts.fails or 5)
    assert.equal("open", b:state())
    return b
  end

  -- an anonymous breaker in half_open with no probe admitted yet
  local function half_opened(opts)
    local b = opened(opts)
    clock.now = clock.now + (opts.open_for or opts.window or 10) + 0.01
    assert.equal("half_open", b:state())
    return b
  end

  support.it_runs_on_backend()

  describe("closed -> open", function()
    it("opens exactly at the fails-th failure inside the window", function()
      local b = fuse.new { fails = 3, window = 10, open_for = 5 }
      assert.equal("closed", b:state())
      fail(b, 2)
      assert.equal("closed", b:state())
      assert.equal(2, b:stats().failures)
      assert.equal(2, ran)
      -- the third failure is itself called, and returns its own result
      local r1, r2 = b:call(failing)
      assert.equal(3, ran)
      assert.equal(nil, r1)
      assert.equal("boom", r2)
      assert.equal("open", b:state())
      assert.equal(1, b:stats().opens_total)
    end)

    it("one failure under fails does not trip, however many successes follow", function()
      local b = fuse.new { fails = 5, window = 10 }
      fail(b, 4)
      for _ = 1, 20 do assert.equal("ok", (b:call(working))) end
      assert.equal("closed", b:state())
      -- successes do not wipe the failures of the window: the fifth one trips
      fail(b, 1)
      assert.equal("open", b:state())
    end)

    it("failures spread over the window add up", function()
      local b = fuse.new { fails = 3, window = 10 }
      fail(b); clock:advance(3)
      fail(b); clock:advance(3)
      assert.equal("closed", b:state())
      fail(b)
      assert.equal("open", b:state())
    end)

    it("keeps window counts in stats()", function()
      local b = fuse.new { fails = 5, window = 10 }
      fail(b, 2)
      b:call(working)
      local s = b:stats()
      assert.equal("closed", s.state)
      assert.equal(3, s.calls)
      assert.equal(2, s.failures)
      assert.near(2 / 3, s.failure_rate, EPS)
      assert.equal(0, s.retry_after)
      assert.equal(3, s.calls_total)
      assert.equal(1, s.successes_total)
      assert.equal(2, s.failures_total)
      assert.equal(0, s.opens_total)
    end)
  end)

  describe("the window", function()
    -- bucket boundaries are unknown to the user: try failures at several phases
    local phases = { 0, 0.013, 0.25, 0.5, 0.77, 0.999 }

    -- every phase for the usual windows, every other phase for the rest
    local cases = {}
    for wi, window in ipairs { 10, 0.5, 0.01, 1, 3, 7, 86400 } do
      for pi, phase in ipairs(phases) do
        if wi <= 2 or pi % 2 == 0 then cases[#cases + 1] = { window, phase } end
      end
    end

    for _, case in ipairs(cases) do
      local window, phase = case[1], case[2]
      local label = ("window %s, phase %s"):format(window, phase)

      it("a failure still counts just before `window` seconds (" .. label .. ")", function()
        clock.now = 1000 + phase * window
        local b = fuse.new { fails = 2, window = window }
        fail(b)
        clock:advance(window * 0.999)
        assert.equal(1, b:stats().failures)
        fail(b)
        assert.equal("open", b:state())
      end)

      it("a failure no longer counts after `window * 1.1` seconds (" .. label .. ")", function()
        clock.now = 1000 + phase * window
        local b = fuse.new { fails = 2, window = window }
        fail(b)
        clock.now = clock.now + window * 1.1 + window * 0.001
        assert.equal(0, b:stats().failures)
        fail(b)
        assert.equal("closed", b:state())
        assert.equal(1, b:stats().failures)
      end)
    end

    for _, start in ipairs { 0, 1000, 123456.789, 2e9 } do
      for _, window in ipairs { 0.01, 0.3, 1, 3, 4, 7, 20, 3600 } do
        it(("fails = 2 trips with window %s at clock %s"):format(window, start), function()
          clock.now = start
          local b = fuse.new { fails = 2, window = window }
          fail(b)
          assert.equal(1, b:stats().failures)
          assert.equal("closed", b:state())
          clock:advance(window / 2)
          fail(b)
          assert.equal("open", b:state())
        end)
      end
    end

    it("slides: old failures drop out one by one", function()
      local b = fuse.new { fails = 3, window = 10 }
      fail(b)             -- t = 0
      clock:advance(6)
      fail(b)             -- t = 6
      clock:advance(6)
      fail(b)             -- t = 12: the one at 0 is older than 11
      assert.equal("closed", b:state())
      assert.equal(2, b:stats().failures)
      clock:advance(1)
      fail(b)             -- t = 13: 6, 12, 13
      assert.equal("open", b:state())
    end)

    it("survives a far jump of the clock", function()
      local b = fuse.new { fails = 2, window = 10 }
      fail(b)
      clock:advance(1e7)
      fail(b)
      assert.equal("closed", b:state())
      assert.equal(1, b:stats().failures)
    end)
  end)

  describe("open", function()
    it("rejects without calling fn", function()
      local b = opened { fails = 2, window = 10, open_for = 5 }
      ran = 0
      for _ = 1, 10 do
        local r, rej = b:call(working)
        assert.is_nil(r)
        assert.is_true(fuse.is_rejection(rej))
        assert.equal("open", rej.state)
      end
      assert.equal(0, ran)
      local s = b:stats()
      assert.equal(10, s.rejections_total)
      assert.equal(10, s.rejections)
      assert.equal(2, s.calls_total)
    end)

    it("allow() rejects too", function()
      local b = opened { fails = 1, open_for = 5 }
      local t, rej = b:allow()
      assert.is_nil(t)
      assert.is_true(fuse.is_rejection(rej))
      assert.equal("open", rej.state)
    end)

    it("stays open until open_for has elapsed, then shows half_open without a call", function()
      local b = opened { fails = 1, window = 10, open_for = 5 }
      clock:advance(4.99)
      assert.equal("open", b:state())
      assert.equal("open", b:stats().state)
      clock:advance(0.02)
      assert.equal("half_open", b:state())
      assert.equal("half_open", b:stats().state)
      assert.equal(0, b:stats().retry_after)
    end)

    it("stats() alone shows the due transition", function()
      local b = opened { fails = 1, open_for = 5 }
      clock:advance(5.01)
      assert.equal("half_open", b:stats().state)
    end)

    it("open_for defaults to window", function()
      local b = opened { fails = 1, window = 4 }
      local _, rej = b:call(working)
      assert.near(4, rej.retry_after, EPS)
      clock:advance(3.99)
      assert.equal("open", b:state())
      clock:advance(0.02)
      assert.equal("half_open", b:state())
    end)

    it("admits the next call as a probe once open_for has elapsed (lazily)", function()
      local b = opened { fails = 1, open_for = 5 }
      clock:advance(5.01)
      ran = 0
      assert.equal("ok", (b:call(working)))
      assert.equal(1, ran)
      assert.equal("closed", b:state())
    end)
  end)

  describe("half_open", function()
    it("admits exactly `probes` concurrent probes and rejects the extra as half_open", function()
      local b = half_opened { fails = 1, open_for = 5, probes = 3 }
      local tickets = {}
      for i = 1, 3 do
        local t, rej = b:allow()
        assert.is_nil(rej)
        assert.is_number(t)
        assert.is_true(t > 0)
        tickets[i] = t
      end
      local t4, rej = b:allow()
      assert.is_nil(t4)
      assert.is_true(fuse.is_rejection(rej))
      assert.equal("half_open", rej.state)
      assert.is_number(rej.retry_after)
      assert.is_true(rej.retry_after >= 0)
      -- a guarded call is rejected the same way, without calling fn
      ran = 0
      local r, rej2 = b:call(working)
      assert.is_nil(r)
      assert.equal(0, ran)
      assert.equal("half_open", rej2.state)
      assert.equal("half_open", b:state())
      -- three distinct tickets, and their three successes close the circuit
      assert.is_true(tickets[1] ~= tickets[2] and tickets[2] ~= tickets[3] and tickets[1] ~= tickets[3])
      for i = 1, 3 do b:report(tickets[i], true) end
      assert.equal("closed", b:state())
    end)

    it("a finished probe gives its slot back", function()
      -- `probes` calls at once: a probe that succeeded makes room for another
      local b = half_opened { fails = 1, open_for = 5, probes = 2 }
      local t1 = b:allow()
      local t2 = b:allow()
      assert.is_nil((b:allow()))
      b:report(t1, true)
      assert.equal("half_open", b:state())
      local t3 = b:allow()
      assert.is_number(t3)
      assert.is_nil((b:allow()))
      b:report(t2, true)
      assert.equal("closed", b:state())
      -- t3 belongs to the half-open generation: its failure is ignored now
      b:report(t3, false)
      assert.equal("closed", b:state())
      assert.equal(0, b:stats().failures)
    end)

    it("an ignored probe gives its slot back", function()
      local b = half_opened { fails = 1, open_for = 5, probes = 1 }
      local t1 = b:allow()
      assert.is_nil((b:allow()))
      b:report(t1, nil)
      assert.equal("half_open", b:state())
      local t2 = b:allow()
      assert.is_number(t2)
      b:report(t2, true)
      assert.equal("closed", b:state())
    end)

    it("a probe ignored by is_failure gives its slot back", function()
      local b = half_opened { fails = 1, open_for = 5, probes = 1,
        is_failure = function(_, r) if r == "meh" then return nil end return r == nil end }
      assert.equal("meh", (b:call(function() return "meh" end)))
      assert.equal("half_open", b:state())
      assert.equal("ok", (b:call(working)))
      assert.equal("closed", b:state())
    end)

    it("`probes` probe successes close it", function()
      local b = half_opened { fails = 1, open_for = 5, probes = 2 }
      local t1, t2 = b:allow(), b:allow()
      b:report(t1, true)
      assert.equal("half_open", b:state())
      b:report(t2, true)
      assert.equal("closed", b:state())
    end)

    it("`probes` successful calls in a row close it", function()
      local b = half_opened { fails = 1, open_for = 5, probes = 3 }
      b:call(working); b:call(working)
      assert.equal("half_open", b:state())
      b:call(working)
      assert.equal("closed", b:state())
      assert.equal(3, ran - 1)
    end)

    it("one probe failure re-opens it; the other probes' outcomes are then ignored", function()
      local b = half_opened { fails = 1, open_for = 5, probes = 3 }
      local t1, t2, t3 = b:allow(), b:allow(), b:allow()
      b:report(t1, false)
      assert.equal("open", b:state())
      b:report(t2, true)
      b:report(t3, true)
      assert.equal("open", b:state())
      assert.equal(2, b:stats().opens_total)
      local _, rej = b:allow()
      assert.near(5, rej.retry_after, EPS)
    end)

    it("a failing probe call re-opens it", function()
      local b = half_opened { fails = 1, open_for = 5 }
      local r1, r2 = b:call(failing)
      assert.is_nil(r1)
      assert.equal("boom", r2)
      assert.equal("open", b:state())
    end)

    it("a probe past probe_timeout frees its slot and re-opens the circuit (seen by state())", function()
      local b = half_opened { fails = 1, open_for = 5, probe_timeout = 2, probes = 1 }
      local t = b:allow()
      assert.is_number(t)
      clock:advance(1.99)
      assert.equal("half_open", b:state())
      clock:advance(0.02)
      assert.equal("open", b:state())
      assert.equal(2, b:stats().opens_total)
      -- the late report changes nothing
      b:report(t, true)
      assert.equal("open", b:state())
      -- after open_for the slot is free again
      clock:advance(5.01)
      assert.equal("half_open", b:state())
      local t2 = b:allow()
      assert.is_number(t2)
      b:report(t2, true)
      assert.equal("closed", b:state())
    end)

    it("a probe past probe_timeout re-opens the circuit (seen by the next call)", function()
      local b = half_opened { fails = 1, open_for = 5, probe_timeout = 2, probes = 1 }
      local t = b:allow()
      clock:advance(2.01)
      ran = 0
      local r, rej = b:call(working)
      assert.is_nil(r)
      assert.equal(0, ran)
      assert.is_true(fuse.is_rejection(rej))
      assert.equal("open", rej.state)
      b:report(t, true)
      assert.equal("open", b:state())
    end)

    it("probe_timeout defaults to window", function()
      local b = half_opened { fails = 1, window = 3, open_for = 1 }
      b:allow()
      clock:advance(2.99)
      assert.equal("half_open", b:state())
      clock:advance(0.02)
      assert.equal("open", b:state())
    end)
  end)

  describe("generations", function()
    it("a ticket taken while closed and reported after the circuit opened changes nothing", function()
      local b = fuse.new { fails = 2, window = 10, open_for = 5 }
      local t = b:allow()
      fail(b, 2)
      assert.equal("open", b:state())
      local before = b:stats()
      b:report(t, false)
      local after = b:stats()
      assert.equal("open", after.state)
      assert.equal(before.opens_total, after.opens_total)
      assert.near(before.retry_after, after.retry_after, EPS)
    end)

    it("a closed-generation success reported in half_open is not a probe success", function()
      local b = fuse.new { fails = 1, window = 10, open_for = 5, probes = 1 }
      local t = b:allow()
      fail(b)
      clock:advance(5.01)
      assert.equal("half_open", b:state())
      b:report(t, true)
      assert.equal("half_open", b:state())
      -- and it took no probe slot
      assert.is_number((b:allow()))
    end)

    it("a closed-generation failure reported after reset is not counted in the fresh window", function()
      local b = fuse.new { fails = 2, window = 10 }
      local t = b:allow()
      fail(b)
      b:reset()
      b:report(t, false)
      assert.equal(0, b:stats().failures)
      fail(b)
      assert.equal("closed", b:state())
    end)

    it("a half-open probe reported after force_open / disable / reset changes nothing", function()
      for _, op in ipairs { "force_open", "disable", "reset" } do
        local b = half_opened { fails = 1, open_for = 5, probes = 1 }
        local t = b:allow()
        b[op](b)
        local st = b:state()
        local before = b:stats()
        b:report(t, false)
        local after = b:stats()
        assert.equal(st, after.state)
        assert.equal(before.failures, after.failures)
        assert.equal(before.failures_total, after.failures_total)
        assert.equal(before.opens_total, after.opens_total)
      end
    end)
  end)

  describe("closing", function()
    it("starts a fresh window: failures from before the open do not count", function()
      local b = fuse.new { fails = 3, window = 10, open_for = 5 }
      fail(b); clock:advance(1)
      fail(b); clock:advance(1)
      fail(b)
      assert.equal("open", b:state())
      clock:advance(5.01)
      b:call(working)
      assert.equal("closed", b:state())
      local s = b:stats()
      assert.equal(0, s.failures)
      assert.equal(0, s.calls)
      -- the old failures are less than `window` old, yet two new ones do not trip
      fail(b, 2)
      assert.equal("closed", b:state())
      fail(b)
      assert.equal("open", b:state())
    end)

    it("reset() starts a fresh window too", function()
      local b = fuse.new { fails = 3, window = 10 }
      fail(b, 2)
      b:reset()
      assert.equal(0, b:stats().failures)
      fail(b, 2)
      assert.equal("closed", b:state())
    end)
  end)

  describe("backoff", function()
    it("multiplies open_for after each failed probe, up to max_open_for; a close resets it", function()
      local b = opened { fails = 1, open_for = 5, backoff = 2, max_open_for = 15, probe_timeout = 100 }
      local function retry() return (select(2, b:allow())).retry_after end
      assert.near(5, retry(), EPS)
      for _, expected in ipairs { 10, 15, 15 } do
        clock.now = clock.now + b:stats().retry_after + 0.01
        assert.equal("half_open", b:state())
        b:call(failing)
        assert.equal("open", b:state())
        assert.near(expected, retry(), EPS)
        clock.now = clock.now + expected - 0.02
        assert.equal("open", b:state())
        clock:advance(0.01)  -- retry_after left: 0.01
      end
      clock:advance(0.02)
      b:call(working)
      assert.equal("closed", b:state())
      fail(b)
      assert.near(5, retry(), EPS)
    end)

    it("a probe timeout counts as a failed probe", function()
      local b = half_opened { fails = 1, open_for = 5, backoff = 2, probe_timeout = 1 }
      b:allow()
      clock:advance(1.01)
      assert.equal("open", b:state())
      local ra = b:stats().retry_after
      assert.is_true(ra > 9 and ra <= 10 + EPS, "retry_after " .. ra)
    end)
  end)

  describe("jitter", function()
    it("shortens each open period by a random fraction up to jitter", function()
      local b = fuse.new { fails = 1, open_for = 10, jitter = 0.5 }
      local shorter = 0
      for _ = 1, 40 do
        b:reset()
        fail(b)
        local ra = b:stats().retry_after
        assert.is_true(ra >= 5 - EPS and ra <= 10 + EPS, "retry_after " .. ra)
        if ra < 10 - 1e-3 then shorter = shorter + 1 end
      end
      assert.is_true(shorter > 0)
    end)
  end)

  describe("manual states", function()
    local setups = {
      closed = function() return fuse.new { fails = 2, open_for = 5 } end,
      open = function() return opened { fails = 2, open_for = 5 } end,
      half_open = function() return half_opened { fails = 2, open_for = 5 } end,
      forced_open = function()
        local b = fuse.new { fails = 2, open_for = 5 }
        b:force_open()
        return b
      end,
      disabled = function()
        local b = fuse.new { fails = 2, open_for = 5 }
        b:disable()
        return b
      end,
    }
    local order = { "closed", "open", "half_open", "forced_open", "disabled" }

    for _, from in ipairs(order) do
      it("reset() from " .. from .. " closes with a fresh window", function()
        local b = setups[from]()
        assert.equal(from, b:state())
        b:reset()
        assert.equal("closed", b:state())
        local s = b:stats()
        assert.equal(0, s.calls)
        assert.equal(0, s.failures)
        fail(b)
        assert.equal("closed", b:state())
        fail(b)
        assert.equal("open", b:state())
      end)

      it("force_open() from " .. from .. " rejects everything, for ever", function()
        local b = setups[from]()
        b:force_open()
        assert.equal("forced_open", b:state())
        ran = 0
        for _, dt in ipairs { 0, 5.01, 100, 1e6 } do
          clock:advance(dt)
          local r, rej = b:call(working)
          assert.is_nil(r)
          assert.is_true(fuse.is_rejection(rej))
          assert.equal("forced_open", rej.state)
          assert.equal(0, rej.retry_after)
          local t, rej2 = b:allow()
          assert.is_nil(t)
          assert.equal("forced_open", rej2.state)
          assert.equal("forced_open", b:state())
          assert.equal(0, b:stats().retry_after)
        end
        assert.equal(0, ran)
      end)

      it("disable() from " .. from .. " passes every call and counts nothing", function()
        local b = setups[from]()
        b:disable()
        assert.equal("disabled", b:state())
        local before = b:stats()
        ran = 0
        for i = 1, 100 do
          local r1, r2 = b:call(failing)
          assert.is_nil(r1)
          assert.equal("boom", r2)
          if i % 10 == 0 then clock:advance(1000) end
        end
        for _ = 1, 10 do
          local t = b:allow()
          assert.is_number(t)
          b:report(t, false)
        end
        assert.equal(100, ran)
        assert.equal("disabled", b:state())
        local s = b:stats()
        assert.equal(0, s.calls)
        assert.equal(0, s.failures)
        assert.equal(before.calls_total, s.calls_total)
        assert.equal(before.failures_total, s.failures_total)
        assert.equal(before.opens_total, s.opens_total)
        assert.equal(before.rejections_total, s.rejections_total)
      end)
    end
  end)

  describe("retry_after", function()
    it("counts down while open, in the rejection and in stats()", function()
      local b = opened { fails = 1, open_for = 5 }
      local _, rej = b:call(working)
      assert.near(5, rej.retry_after, EPS)
      assert.near(5, b:stats().retry_after, EPS)
      clock:advance(2)
      _, rej = b:call(working)
      assert.near(3, rej.retry_after, EPS)
      assert.near(3, b:stats().retry_after, EPS)
      clock:advance(2.5)
      _, rej = b:allow()
      assert.near(0.5, rej.retry_after, EPS)
    end)

    it("is 0 in stats() unless open", function()
      local b = fuse.new { fails = 1, open_for = 5 }
      assert.equal(0, b:stats().retry_after)
      fail(b)
      clock:advance(5.01)
      assert.equal("half_open", b:stats().state)
      assert.equal(0, b:stats().retry_after)
      b:force_open()
      assert.equal(0, b:stats().retry_after)
      b:disable()
      assert.equal(0, b:stats().retry_after)
    end)
  end)

  describe("allow/report", function()
    it("report(ticket, nil) counts the call nowhere", function()
      local b = fuse.new { fails = 1 }
      local t = b:allow()
      b:report(t, nil)
      local s = b:stats()
      assert.equal("closed", s.state)
      assert.equal(0, s.calls)
      assert.equal(0, s.calls_total)
    end)

    it("report(ticket, false) counts a failure and can trip", function()
      local b = fuse.new { fails = 2 }
      b:report(b:allow(), false)
      assert.equal("closed", b:state())
      b:report(b:allow(), true)
      b:report(b:allow(), false)
      assert.equal("open", b:state())
      assert.equal(1, b:stats().successes_total)
    end)

    it("a garbage ticket raises", function()
      local b = fuse.new {}
      assert.has_error(function() b:report(-1, true) end)
      assert.has_error(function() b:report(0.5, true) end)
      assert.has_error(function() b:report("x", true) end)
    end)

    it("reporting a probe ticket twice does not count it twice", function()
      local b = half_opened { fails = 1, open_for = 5, probes = 2 }
      local t = b:allow()
      b:report(t, true)
      pcall(b.report, b, t, true)  -- may raise (API.md says it does); it must not count
      assert.equal("half_open", b:state())
    end)

  end)
end)
