-- max_concurrent (DESIGN.md, "Isolation"): at most N guarded calls of a breaker at once;
-- a call past the limit is rejected (reason "full") without calling fn and without
-- moving the circuit; permits are given back however the call ends. Run once per backend.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

-- Whether a coroutine may yield across pcall (not PUC Lua 5.1: there a guarded function,
-- run under pcall, cannot yield, so calls are held open by nesting instead).
local PCALL_YIELDS = (function()
  local co = coroutine.create(function() return pcall(coroutine.yield) end)
  coroutine.resume(co)
  return coroutine.status(co) == "suspended"
end)()

local unique = support.unique_names("s18")

local function err_of(f, ...)
  local ok, e = pcall(f, ...)
  assert.is_false(ok)
  return e
end

describe("isolation #" .. BACKEND, function()
  support.it_runs_on_backend()

  describe("options", function()
    it("max_concurrent is an integer from 1 to 1,000,000, named in every message", function()
      for _, v in ipairs({ 0, -1, 1.5, "3", 1000001, 0 / 0, math.huge }) do
        local e = err_of(fuse.wrap, print, { max_concurrent = v })
        assert.matches("option 'max_concurrent'", e, 1, true)
      end
      assert.matches("an integer from 1 to 1000000, got 1000001",
        err_of(fuse.new, { max_concurrent = 1000001 }), 1, true)
      assert.is_truthy(fuse.new({ max_concurrent = 1 }))
      assert.is_truthy(fuse.new({ max_concurrent = 1000000 }))
    end)

    it("max_wait needs OpenResty and max_concurrent", function()
      assert.matches("fuse: option 'max_wait' needs OpenResty",
        err_of(fuse.new, { max_concurrent = 2, max_wait = 0.2 }), 1, true)
      assert.equal("fuse: option 'max_wait' has no effect without 'max_concurrent'",
        err_of(fuse.new, { max_wait = 0 }))
      assert.matches("option 'max_wait' must be a number from 0 to 3600, got -1",
        err_of(fuse.new, { max_concurrent = 2, max_wait = -1 }), 1, true)
      assert.matches("option 'max_wait' must be a number of seconds, got \"1\"",
        err_of(fuse.new, { max_concurrent = 2, max_wait = "1" }), 1, true)
      assert.is_truthy(fuse.new({ max_concurrent = 2, max_wait = 0 }))  -- 0: no wait, anywhere
    end)

    it("a name shared with another max_concurrent is a mismatch that names it", function()
      local name = unique("iso")
      fuse.new({ name = name, max_concurrent = 2 })
      assert.matches("max_concurrent (2 vs 3)", err_of(fuse.new, { name = name, max_concurrent = 3 }), 1, true)
      assert.matches("max_concurrent (2 vs off)", err_of(fuse.new, { name = name }), 1, true)
      assert.equal(2, fuse.new({ name = name, max_concurrent = 2 }).cfg.max_concurrent)
    end)
  end)

  describe("calls", function()
    it("a call past the limit is rejected without calling fn: reason full, fields, text", function()
      local name = unique("iso")
      local b = fuse.new({ name = name, max_concurrent = 1 })
      local inner_ran, r1, r2 = false, nil, nil
      assert.equal("outer", b:call(function()
        r1, r2 = b:call(function() inner_ran = true end)  -- a second call while the first runs
        return "outer"
      end))
      assert.is_false(inner_ran)
      assert.is_nil(r1)
      assert.is_true(fuse.is_rejection(r2))
      assert.equal("full", r2.reason)
      assert.equal(name, r2.name)
      assert.equal("closed", r2.state)
      assert.equal(0, r2.retry_after)
      assert.equal("fuse: breaker '" .. name .. "' is full (1 calls running)", tostring(r2))
      local s = b:stats()
      assert.equal(0, s.running)
      assert.equal(1, s.full_total)
      assert.equal(1, s.rejections_total)
      assert.equal("closed", s.state)
      assert.equal(0, s.failures)
    end)

    it("anonymous breakers say so; circuit rejections have reason open", function()
      local b = fuse.new({ max_concurrent = 3, fails = 1 })
      local _, rej = b:call(function() return b:call(function() end) end)
      assert.is_nil(rej)  -- 2 of 3: runs
      local depth = 0
      local function nest()
        depth = depth + 1
        return b:call(nest)
      end
      local r1, r2 = b:call(nest)
      assert.is_nil(r1)
      assert.equal(3, depth)  -- the fourth call was rejected
      assert.equal("fuse: breaker 'anonymous' is full (3 calls running)", tostring(r2))
      b:call(error, "boom")
      local _, open = b:call(print)
      assert.equal("open", open.reason)
      assert.equal("fuse: circuit 'anonymous' is open", tostring(open))
      assert.equal(0, b:stats().running)  -- the rejected call gave its permit back
    end)

    it("the fallback gets the rejection and the call's arguments", function()
      local b = fuse.new({ max_concurrent = 1 })
      local got
      local f = b:wrap(function(x) return x end, function(err, a, c)
        got = { err = err, a = a, c = c }
        return "fb"
      end)
      local g = b:wrap(function() return f("x", "y") end)
      assert.equal("fb", g())
      assert.equal("full", got.err.reason)
      assert.equal("x", got.a)
      assert.equal("y", got.c)
      assert.equal("x", f("x"))  -- the limit is whole again
    end)

    it("a full rejection does not move the circuit, whatever the count", function()
      local b = fuse.new({ max_concurrent = 1, fails = 1 })
      for _ = 1, 20 do b:call(function() b:call(print) end) end
      local s = b:stats()
      assert.equal("closed", s.state)
      assert.equal(20, s.full_total)
      assert.equal(0, s.failures_total)
      assert.equal(20, s.successes_total)
    end)

    it("raising, failing and misjudged calls give their permit back", function()
      local b = fuse.new({ max_concurrent = 1, fails = 1000 })
      for _ = 1, 10 do
        assert.is_false((pcall(b.call, b, error, "boom")))
        local r, e = b:call(function() return nil, "down" end)
        assert.is_nil(r)
        assert.equal("down", e)
      end
      assert.equal(0, b:stats().running)
      assert.equal(20, b:stats().failures_total)
      local bad = fuse.wrap(print, { max_concurrent = 1, is_failure = function() error("judge") end })
      assert.is_false((pcall(bad)))
      local _, bb = fuse.wrap(print, { max_concurrent = 1 })
      assert.equal(0, bb:stats().running)
      assert.is_false((pcall(bad)))  -- again: the first gave its permit back
    end)

    it("open, forced_open and half_open without a slot give the permit back", function()
      local b = fuse.new({ max_concurrent = 1, fails = 1 })
      b:force_open()
      for _ = 1, 5 do b:call(print) end
      assert.equal(0, b:stats().running)
      b:reset()
      assert.is_true(b:call(function() return true end))
    end)

    it("coroutines hold their permits across yields", function()
      if not PCALL_YIELDS then
        pending("PUC Lua 5.1 cannot yield across pcall")
        return
      end
      local name = unique("iso")
      local ran = 0
      local f = fuse.wrap(function()
        ran = ran + 1
        coroutine.yield("inside")
        return "done"
      end, { name = name, max_concurrent = 2 })
      local b = fuse.get(name)
      local cos = {}
      for i = 1, 3 do
        cos[i] = coroutine.create(f)
        assert.is_true((coroutine.resume(cos[i])))
      end
      assert.equal("dead", coroutine.status(cos[3]))  -- rejected at once
      assert.equal(2, ran)
      assert.equal(2, b:stats().running)
      assert.equal(1, b:stats().full_total)
      local ok, v = coroutine.resume(cos[1])
      assert.is_true(ok)
      assert.equal("done", v)
      assert.equal(1, b:stats().running)
      local co = coroutine.create(f)
      assert.is_true((coroutine.resume(co)))
      assert.equal("suspended", coroutine.status(co))  -- a permit was free again
      coroutine.resume(cos[2])
      coroutine.resume(co)
      assert.equal(0, b:stats().running)
    end)

    it("a call whose name was removed and found again meanwhile gives its permit back where it took it", function()
      if not PCALL_YIELDS then
        pending("PUC Lua 5.1 cannot yield across pcall")
        return
      end
      local name = unique("iso-refind")
      local f = fuse.wrap(function()
        coroutine.yield("inside")
        return "done"
      end, { name = name, max_concurrent = 2 })
      local co1 = coroutine.create(f)
      assert.is_true((coroutine.resume(co1)))  -- holds a permit of the first breaker
      assert.is_true(fuse.remove(name))
      -- the next call finds the handle stale (its permit back at once), finds the name
      -- again (a new breaker) and takes a permit there
      local co2 = coroutine.create(f)
      assert.is_true((coroutine.resume(co2)))
      assert.equal("suspended", coroutine.status(co2))
      local ok, v = coroutine.resume(co1)  -- its permit goes back to the first breaker's slot
      assert.is_true(ok)
      assert.equal("done", v)
      ok, v = coroutine.resume(co2)
      assert.is_true(ok)
      assert.equal("done", v)
      local b = fuse.get(name)
      assert.equal(0, b:stats().running)
      assert.equal(0, b:stats().full_total)
      -- the limit is whole: two at once again, not a third
      local a, c, d = coroutine.create(f), coroutine.create(f), coroutine.create(f)
      coroutine.resume(a)
      coroutine.resume(c)
      coroutine.resume(d)
      assert.equal("suspended", coroutine.status(a))
      assert.equal("suspended", coroutine.status(c))
      assert.equal("dead", coroutine.status(d))
      coroutine.resume(a)
      coroutine.resume(c)
      assert.equal(0, b:stats().running)
    end)
  end)

  describe("allow and report", function()
    it("a ticket holds its permit until report, whatever the outcome", function()
      local b = fuse.new({ name = unique("iso"), max_concurrent = 2 })
      local t1, t2 = b:allow(), b:allow()
      assert.is_number(t1)
      assert.is_number(t2)
      local none, rej = b:allow()
      assert.is_nil(none)
      assert.equal("full", rej.reason)
      assert.equal(2, b:stats().running)
      b:report(t1, false)
      assert.equal(1, b:stats().running)
      b:report(t2, nil)
      assert.equal(0, b:stats().running)
      assert.has_error(function() b:report(t2, true) end)  -- twice: refused, nothing given back
      assert.equal(0, b:stats().running)
      local t3, t4 = b:allow(), b:allow()
      assert.is_number(t3)
      assert.is_number(t4)
      b:report(t3, true)
      b:report(t4, true)
      assert.equal(1, b:stats().full_total)
    end)

    -- More tickets out at once than a thread's ledger holds (4,096): the core leaves the
    -- rest untracked, and untracked tickets of one state are equal. allow gives each
    -- untracked ticket a stand-in (a negative number, never issued again), so every
    -- call's ticket is its own and gives back its own permit, whoever reports it (before
    -- 3870cd4: 903 of 5,000 permits kept for good; after it, equal tickets shared one
    -- entry list, and a report from another request could give back the permit of a
    -- call still running: test/isolation.t.sh, "equal tickets", shows it in nginx).
    local function many(b, n)
      local tickets = {}
      for i = 1, n do tickets[i] = assert(b:allow()) end
      return tickets
    end

    it("untracked tickets get stand-ins: each call's ticket is its own", function()
      local b = fuse.new({ name = unique("iso"), fails = 100000, max_concurrent = 100000 })
      local tickets = many(b, 5000)
      local distinct, n, stand_ins = {}, 0, 0
      for _, t in ipairs(tickets) do
        if not distinct[t] then n = n + 1 end
        distinct[t] = true
        if t < 0 then stand_ins = stand_ins + 1 end
      end
      assert.equal(5000, n)
      assert.is_true(stand_ins > 0)  -- (the case this is about: the core's tickets equal)
      assert.equal(5000, b:stats().running)
      for i = 1, 5000, 2 do b:report(tickets[i], true) end  -- (stand-ins and the ticket
      for i = 5000, 2, -2 do b:report(tickets[i], true) end -- they stand for, in any order)
      assert.equal(0, b:stats().running)
    end)

    it("a stand-in reports its call's outcome once, to its breaker only", function()
      local b = fuse.new({ name = unique("iso"), fails = 100000, max_concurrent = 100000 })
      local tickets = many(b, 5000)
      local s = tickets[5000]
      assert.is_true(s < 0)
      b:report(s, false)
      local st = b:stats()
      assert.same({ 4999, 1, 0 }, { st.running, st.failures_total, st.successes_total })
      assert.matches("^fuse: report: ticket %-%d+ was already reported, or is another breaker's$",
        err_of(b.report, b, s, true))
      local other = fuse.new({ name = unique("iso"), max_concurrent = 10 })
      assert.matches("was already reported, or is another breaker's",
        err_of(other.report, other, tickets[4999], true))
      assert.matches("^fuse: report: %-0.5 is not a ticket this breaker's allow issued",
        err_of(b.report, b, -0.5, true))
      assert.equal(4999, b:stats().running)
      for i = 1, 4999 do b:report(tickets[i], true) end
      st = b:stats()
      assert.same({ 0, 1, 4999 }, { st.running, st.failures_total, st.successes_total })
    end)

    -- An untracked ticket reported twice: the core cannot tell (it checks such a ticket
    -- by breaker, generation and state only), and before, a later call that got an equal
    -- ticket held its permit under that same number: the second report gave it back
    -- while that call ran (under nginx: a report after fuse.settle() counted the call).
    it("an untracked ticket reported twice is refused and gives back no other call's permit", function()
      local b = fuse.new({ name = unique("iso"), fails = 100000, max_concurrent = 100000 })
      local tickets = many(b, 5000)
      local u
      for _, t in ipairs(tickets) do
        if t < 0 or t % 256 < 128 then u = t; break end  -- (a stand-in, or bit 7 clear)
      end
      assert.is_number(u)
      b:report(u, true)
      local later = assert(b:allow())  -- (the core's ticket equal to u's)
      assert.equal(5000, b:stats().running)
      assert.matches("was already reported", err_of(b.report, b, u, true))
      assert.equal(5000, b:stats().running)
      b:report(later, true)
      for _, t in ipairs(tickets) do if t ~= u then b:report(t, true) end end
      assert.equal(0, b:stats().running)
    end)

    -- Before: allow took the permit on the removed breaker, then re-found the name and
    -- issued the ticket there: the new breaker's limit did not count it (two tickets out
    -- on a limit of 1).
    it("an object whose breaker was removed counts its ticket against its name's limit", function()
      local name = unique("iso")
      local b = fuse.new({ name = name, max_concurrent = 1 })
      assert.is_true(fuse.remove(name))
      local t1 = b:allow()
      assert.is_number(t1)
      assert.equal(1, fuse.get(name):stats().running)
      local t2, rej = b:allow()
      assert.is_nil(t2)
      assert.equal("full", rej.reason)
      b:report(t1, true)
      assert.equal(0, fuse.get(name):stats().running)
      local t3 = b:allow()
      assert.is_number(t3)
      b:report(t3, true)
    end)

    it("a ticket the circuit rejects holds no permit", function()
      local b = fuse.new({ max_concurrent = 1, fails = 1 })
      b:force_open()
      local t, rej = b:allow()
      assert.is_nil(t)
      assert.equal("open", rej.reason)
      assert.equal(0, b:stats().running)
    end)
  end)

  describe("observing", function()
    it("stats, metrics and the admin JSON show running and full_total", function()
      local name = unique("iso")
      local b = fuse.new({ name = name, max_concurrent = 1 })
      local text
      b:call(function()
        text = fuse.metrics()
        return b:call(print)
      end)
      assert.matches('fuse_running{name="' .. name .. '"} 1\n', text, 1, true)
      assert.matches("# TYPE fuse_running gauge", text, 1, true)
      local after = fuse.metrics()
      assert.matches('fuse_running{name="' .. name .. '"} 0\n', after, 1, true)
      assert.matches('fuse_full_total{name="' .. name .. '"} 1\n', after, 1, true)
      assert.matches("# TYPE fuse_full_total counter", after, 1, true)
      assert.matches('fuse_rejections_total{name="' .. name .. '"} 1\n', after, 1, true)
      local j = require("fuse.admin").breaker_json(b)
      assert.equal(0, j.running)
      assert.equal(1, j.full_total)
    end)

    it("breakers without the option show running 0 and full_total 0", function()
      local s = fuse.new({}):stats()
      assert.equal(0, s.running)
      assert.equal(0, s.full_total)
    end)
  end)
end)
