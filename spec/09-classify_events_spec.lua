-- is_failure, on_state_change, and outcomes of an earlier generation.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

describe("fuse #" .. BACKEND, function()
  local clock = support.fake_clock(1000, 1000)

  local uname = support.unique_names("spec09")
  local outcome = support.outcome

  local function recorder()
    local events = {}
    local function listener(name, from, to)
      events[#events + 1] = { name = name, from = from, to = to }
    end
    return events, listener
  end

  local function totals(b)
    local s = b:stats()
    return { s.calls, s.failures, s.calls_total, s.successes_total, s.failures_total }
  end

  support.it_runs_on_backend()

  describe("is_failure", function()
    it("receives (true, ...) with every result of a call that returned", function()
      local got
      local f = fuse.wrap(function() return 1, nil, "x", nil end, {
        is_failure = function(...) got = { n = select("#", ...), ... } end,
      })
      f()
      assert.equal(5, got.n)
      assert.is_true(got[1])
      assert.equal(1, got[2])
      assert.is_nil(got[3])
      assert.equal("x", got[4])
      assert.is_nil(got[5])
    end)

    it("receives (false, err) with the very error value a call raised", function()
      local E = setmetatable({}, { __tostring = function() return "E" end })
      local got
      local f = fuse.wrap(function() error(E) end, {
        is_failure = function(...) got = { n = select("#", ...), ... }; return true end,
      })
      local ok, err = pcall(f)
      assert.is_false(ok)
      assert.equal(E, err)
      assert.equal(2, got.n)
      assert.is_false(got[1])
      assert.equal(E, got[2])
    end)

    it("true: a returning call counts as a failure and can open the circuit", function()
      local f, b = fuse.wrap(function(status) return status end, {
        fails = 2,
        is_failure = function(ok, status) return not ok or status >= 500 end,
      })
      assert.equal(200, f(200))
      assert.equal(503, f(503))                 -- a failure without fallback: results as is
      local s = b:stats()
      assert.equal(2, s.calls)
      assert.equal(1, s.failures)
      assert.equal(1, s.successes_total)
      assert.equal(1, s.failures_total)
      f(500)
      assert.equal("open", b:state())
    end)

    it("true: a returning call it calls a failure goes to the fallback", function()
      local fb_args
      local f = fuse.wrap(function(status) return status end, {
        is_failure = function(_, status) return status >= 500 end,
        fallback = function(_, ...) fb_args = { n = select("#", ...), ... }; return "fb" end,
      })
      assert.equal("fb", f(502))
      assert.same({ n = 1, 502 }, fb_args)
      assert.equal(201, f(201))
    end)

    it("false: a raised error counts as a success and is re-raised, no fallback", function()
      local E = {}
      local fallback_called = false
      local f, b = fuse.wrap(function() error(E) end, {
        fails = 1,
        is_failure = function() return false end,
        fallback = function() fallback_called = true; return "fb" end,
      })
      for _ = 1, 3 do
        local ok, err = pcall(f)
        assert.is_false(ok)
        assert.equal(E, err)
      end
      assert.is_false(fallback_called)
      local s = b:stats()
      assert.equal("closed", s.state)
      assert.equal(3, s.calls)
      assert.equal(0, s.failures)
      assert.equal(3, s.successes_total)
      assert.equal(0, s.failures_total)
    end)

    it("false: a `nil, err` result counts as a success and is returned as is", function()
      local f, b = fuse.wrap(function() return nil, "not found" end, {
        fails = 1,
        is_failure = function(ok) return not ok end,
      })
      local a, e = f()
      assert.is_nil(a)
      assert.equal("not found", e)
      assert.equal("closed", b:state())
      assert.equal(1, b:stats().successes_total)
    end)

    it("nil: the call counts nowhere (window, rates, min_calls, totals)", function()
      local E = {}
      local f, b = fuse.wrap(function(mode)
        if mode == "raise" then error(E) end
        return mode
      end, {
        failure_rate = 0.5, min_calls = 4,
        is_failure = function(ok, mode)
          if not ok then return nil end         -- raised errors are ignored
          if mode == "skip" then return nil end
          return mode == "bad"
        end,
      })
      f("bad"); f("bad"); f("bad")
      local before = totals(b)
      assert.same({ 3, 3, 3, 0, 3 }, before)
      for _ = 1, 20 do
        assert.equal("skip", f("skip"))         -- results returned unchanged
        local ok, err = pcall(f, "raise")        -- re-raised unchanged
        assert.is_false(ok)
        assert.equal(E, err)
      end
      assert.equal("closed", b:state())         -- ignored calls did not reach min_calls
      assert.same(before, totals(b))
      f("bad")                                  -- 4 / 4
      assert.equal("open", b:state())
    end)

    it("nil through report(ticket, nil) counts nowhere either", function()
      local b = fuse.new{ fails = 2 }
      outcome(b, false)
      local before = totals(b)
      for _ = 1, 10 do outcome(b, nil) end
      assert.same(before, totals(b))
      assert.equal("closed", b:state())
    end)

    -- Reading: an ignored probe gives its slot back without closing or re-opening (as
    -- Resilience4j releases the permission of an ignored call in half-open).
    it("nil on a probe frees the probe slot without a transition", function()
      local b = fuse.new{ fails = 1, open_for = 5, probes = 1 }
      outcome(b, false)
      clock:advance(5.01)
      outcome(b, nil)
      assert.equal("half_open", b:state())
      local t = b:allow()
      assert.is_number(t, "the ignored probe kept its slot")
      b:report(t, true)
      assert.equal("closed", b:state())
    end)

    it("belongs to a breaker object and is used by b:call", function()
      local b = fuse.new{
        fails = 1,
        is_failure = function(ok, v) return not ok or v == "bad" end,
      }
      assert.equal("good", b:call(function() return "good" end))
      assert.equal("closed", b:state())
      b:call(function() return "bad" end)
      assert.equal("open", b:state())
    end)
  end)

  describe("on_state_change", function()
    it("fires once per transition with (name, from, to)", function()
      local events, listener = recorder()
      local name = uname("once")
      local b = fuse.new{ name = name, fails = 1, open_for = 5, on_state_change = listener }
      local f = b:wrap(function(ok) if not ok then error("down", 0) end return "up" end)
      assert.equal(0, #events)
      pcall(f, false)
      assert.same({ { name = name, from = "closed", to = "open" } }, events)
      pcall(f, false)                           -- rejected: no transition
      assert.equal(1, #events)
      clock:advance(5.01)
      assert.equal("up", f(true))               -- open -> half_open -> closed
      assert.same({
        { name = name, from = "closed", to = "open" },
        { name = name, from = "open", to = "half_open" },
        { name = name, from = "half_open", to = "closed" },
      }, events)
      assert.equal("up", f(true))
      assert.equal(3, #events)
    end)

    it("passes a nil name for an anonymous breaker", function()
      local events, listener = recorder()
      local f = fuse.wrap(function() return nil, "e" end, { fails = 1, on_state_change = listener })
      f()
      assert.equal(1, #events)
      assert.is_nil(events[1].name)
      assert.equal("closed", events[1].from)
      assert.equal("open", events[1].to)
    end)

    it("fires on the wrap whose call made the transition, not on other wraps", function()
      local name = uname("shared")
      local ev1, l1 = recorder()
      local ev2, l2 = recorder()
      local f1 = fuse.wrap(function() return nil, "e1" end,
        { name = name, fails = 2, on_state_change = l1 })
      local f2 = fuse.wrap(function(ok) if ok then return "ok" end return nil, "e2" end,
        { name = name, fails = 2, on_state_change = l2 })
      f2(false)
      f1()                                      -- second failure of the shared state
      assert.same({ { name = name, from = "closed", to = "open" } }, ev1)
      assert.same({}, ev2)
      clock:advance(10.01)                      -- open_for defaults to window = 10
      assert.equal("ok", f2(true))
      assert.same({
        { name = name, from = "open", to = "half_open" },
        { name = name, from = "half_open", to = "closed" },
      }, ev2)
      assert.equal(1, #ev1)
    end)

    it("fires for a probe that timed out, on the call that noticed it", function()
      local events, listener = recorder()
      local b = fuse.new{ fails = 1, open_for = 5, probe_timeout = 1, on_state_change = listener }
      outcome(b, false)
      clock:advance(5.01)
      local probe = b:allow()
      assert.is_number(probe)
      assert.equal(2, #events)                  -- closed -> open, open -> half_open
      clock:advance(1.5)
      local t, rej = b:allow()
      assert.is_nil(t)
      assert.is_true(fuse.is_rejection(rej))
      assert.equal(3, #events)
      assert.equal("half_open", events[3].from)
      assert.equal("open", events[3].to)
      b:report(probe, true)                     -- late probe: no transition
      assert.equal(3, #events)
    end)

    it("fires for manual transitions on the breaker object", function()
      local events, listener = recorder()
      local b = fuse.new{ fails = 1, on_state_change = listener }
      b:force_open()
      b:disable()
      b:reset()
      assert.same({
        { from = "closed", to = "forced_open" },
        { from = "forced_open", to = "disabled" },
        { from = "disabled", to = "closed" },
      }, events)
    end)

    it("never lets an error in the listener break the call", function()
      local reported = support.reported(finally)
      local raised = 0
      local function bad_listener()
        raised = raised + 1
        error("listener boom")
      end
      local E = {}
      local f, b = fuse.wrap(function(mode)
        if mode == "raise" then error(E) end
        if mode == "nil" then return nil, "soft" end
        return "fine", nil, 3
      end, { fails = 1, open_for = 5, on_state_change = bad_listener })

      local ok, err = pcall(f, "raise")         -- trips: the original error comes back
      assert.is_false(ok)
      assert.equal(E, err)
      assert.equal(1, raised)
      assert.equal("open", b:state())

      clock:advance(5.01)
      assert.equal(3, select("#", f("ok")))      -- open -> half_open -> closed, results intact
      assert.equal(3, raised)
      assert.equal("closed", b:state())

      local a, e = f("nil")                     -- trips on a `nil, err` result
      assert.is_nil(a)
      assert.equal("soft", e)
      assert.equal(4, raised)

      local g = fuse.wrap(function() error(E) end, {
        fails = 1, on_state_change = bad_listener,
        fallback = function() return "fb" end,
      })
      assert.equal("fb", g())
      assert.equal(5, raised)
      assert.equal(5, #reported)                -- each one reported, none printed
      assert.matches("fuse: on_state_change of breaker 'anonymous' %(closed %-> open%) failed: "
        .. ".*listener boom", reported[1])
    end)

    it("never lets an error in the listener escape allow/report/state/reset", function()
      local reported = support.reported(finally)
      local raised = 0
      local b = fuse.new{
        fails = 1, open_for = 5,
        on_state_change = function() raised = raised + 1; error({}) end,
      }
      local t = b:allow()
      assert.has_no.errors(function() b:report(t, false) end)
      clock:advance(5.01)
      assert.has_no.errors(function() assert.equal("half_open", b:state()) end)
      assert.has_no.errors(function() b:force_open() end)
      assert.has_no.errors(function() b:reset() end)
      assert.equal("closed", b:state())
      assert.is_true(raised >= 3)
      assert.equal(raised, #reported)
      assert.matches("(forced_open -> closed) failed: table: ", reported[#reported], 1, true)
    end)
  end)

  describe("outcomes of an earlier generation", function()
    it("are ignored by the fails rule after the circuit opened and closed", function()
      local b = fuse.new{ fails = 2, open_for = 5 }
      local late = {}
      for i = 1, 5 do late[i] = b:allow() end   -- calls in flight in the closed state
      outcome(b, false)
      outcome(b, false)
      assert.equal("open", b:state())
      clock:advance(5.01)
      outcome(b, true)                          -- probe closes it
      assert.equal("closed", b:state())
      for i = 1, 5 do b:report(late[i], false) end
      assert.equal("closed", b:state())
      assert.equal(0, b:stats().failures)
      assert.equal(0, b:stats().calls)
    end)

    it("are ignored after reset()", function()
      local b = fuse.new{ fails = 2 }
      local late = { b:allow(), b:allow(), b:allow() }
      b:reset()
      for _, t in ipairs(late) do b:report(t, false) end
      assert.equal("closed", b:state())
      assert.equal(0, b:stats().failures)
    end)

    it("are ignored by the rate rule and do not count towards min_calls", function()
      local b = fuse.new{ failure_rate = 0.5, min_calls = 4 }
      local late = {}
      for i = 1, 10 do late[i] = b:allow() end
      b:reset()
      for i = 1, 10 do b:report(late[i], false) end
      assert.equal("closed", b:state())
      assert.equal(0, b:stats().calls)
      outcome(b, false)                         -- 1 / 1 but below min_calls
      assert.equal("closed", b:state())
    end)

    it("are ignored by the slow rules", function()
      local b = fuse.new{ slow = 1, slow_rate = 0.5, min_calls = 2 }
      local late = { b:allow(), b:allow(), b:allow() }
      b:reset()
      for _, t in ipairs(late) do b:report(t, true, 10) end
      local s = b:stats()
      assert.equal(0, s.slow)
      assert.equal(0, s.calls)
      assert.equal("closed", s.state)
    end)

    it("never count as a probe: a closed-state call finishing in half-open", function()
      local b = fuse.new{ fails = 1, open_for = 5, probes = 1 }
      local early_ok, early_bad = b:allow(), b:allow()
      outcome(b, false)
      clock:advance(5.01)
      assert.equal("half_open", b:state())
      b:report(early_ok, true)                  -- must not close the circuit
      assert.equal("half_open", b:state())
      b:report(early_bad, false)                -- must not re-open it
      assert.equal("half_open", b:state())
      local probe = b:allow()
      assert.is_number(probe)                   -- the slot is still free
      b:report(probe, true)
      assert.equal("closed", b:state())
    end)

    it("never count as a probe: a timed-out probe finishing in a later half-open", function()
      local b = fuse.new{ fails = 1, open_for = 5, probes = 1, probe_timeout = 1 }
      outcome(b, false)
      clock:advance(5.01)
      local old_probe = b:allow()
      assert.is_number(old_probe)
      clock:advance(1.5)                        -- timed out: open again
      assert.equal("open", b:state())
      clock:advance(5.01)
      assert.equal("half_open", b:state())
      local probe = b:allow()
      assert.is_number(probe)
      b:report(old_probe, true)
      assert.equal("half_open", b:state())      -- probes = 1: only `probe` can close it
      b:report(probe, true)
      assert.equal("closed", b:state())
    end)

    it("are ignored when the call started while disabled", function()
      local b = fuse.new{ fails = 1 }
      b:disable()
      local t = b:allow()
      assert.is_number(t)
      b:reset()
      b:report(t, false)
      assert.equal("closed", b:state())
      assert.equal(0, b:stats().failures)
    end)
  end)
end)
