-- What a guarded call does: results and errors pass through unchanged, fallbacks,
-- rejections as values, coroutines, on_state_change, is_failure and the default rule.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

local unpack = table.unpack or unpack  -- luacheck: ignore 143

local function pack(...) return { n = select("#", ...), ... } end

-- Whether a coroutine may yield across pcall: LuaJIT and Lua 5.2+ can, PUC Lua 5.1
-- cannot, so there a guarded function (run under pcall) cannot yield.
local PCALL_YIELDS = (function()
  local co = coroutine.create(function() return pcall(coroutine.yield) end)
  coroutine.resume(co)
  return coroutine.status(co) == "suspended"
end)()

-- the three ways to guard a function; each returns the guarded function and its breaker
local FORMS = {
  ["fuse.wrap"] = function(fn, opts)
    return fuse.wrap(fn, opts)
  end,
  ["b:wrap"] = function(fn, opts)
    local fallback = opts.fallback
    local o = {}
    for k, v in pairs(opts) do if k ~= "fallback" then o[k] = v end end
    local b = fuse.new(o)
    return b:wrap(fn, fallback), b
  end,
  ["b:call"] = function(fn, opts)
    local b = fuse.new(opts)
    return function(...) return b:call(fn, ...) end, b
  end,
}
local FORM_NAMES = { "fuse.wrap", "b:wrap", "b:call" }

local unique = support.unique_names("s03")

describe("fuse #" .. BACKEND, function()
  local clock = support.fake_clock(1000)

  support.it_runs_on_backend()

  for _, form in ipairs(FORM_NAMES) do
    local guard = FORMS[form]

    describe(form, function()
      describe("results", function()
        it("passes zero results through", function()
          local f = guard(function() end, {})
          assert.equal(0, select("#", f()))
        end)

        it("passes one result through", function()
          local f = guard(function(x) return x * 2 end, {})
          local r = pack(f(21))
          assert.equal(1, r.n)
          assert.equal(42, r[1])
        end)

        it("passes results with nils through, count included", function()
          local f = guard(function() return 1, nil, nil end, {})
          local r = pack(f())
          assert.equal(3, r.n)
          assert.equal(1, r[1])
          assert.is_nil(r[2])
          assert.is_nil(r[3])
          local g = guard(function() return nil, nil, 3 end, {})
          r = pack(g())
          assert.equal(3, r.n)
          assert.equal(3, r[3])
        end)

        it("passes 250 results through", function()
          local t = {}
          for i = 1, 250 do t[i] = (i % 7 ~= 0) and i or nil end
          local f = guard(function() return unpack(t, 1, 250) end, {})
          local r = pack(f())
          assert.equal(250, r.n)
          for i = 1, 250 do assert.equal(t[i], r[i]) end
        end)

        it("passes the arguments through, nils and count included", function()
          local got
          local f = guard(function(...) got = pack(...); return true end, {})
          f(1, nil, "x", nil)
          assert.equal(4, got.n)
          assert.equal(1, got[1])
          assert.is_nil(got[2])
          assert.equal("x", got[3])
          local big = {}
          for i = 1, 200 do big[i] = i end
          f(unpack(big, 1, 200))
          assert.equal(200, got.n)
          assert.equal(200, got[200])
        end)

        it("counts a success", function()
          local f, b = guard(function() return 1 end, {})
          f()
          if b then
            assert.equal(1, b:stats().successes_total)
            assert.equal(0, b:stats().failures_total)
          end
        end)
      end)

      describe("raised errors", function()
        local values = {
          table = setmetatable({}, { __tostring = function() return "custom" end }),
          string = "plain message",
          number = 42,
          ["false"] = false,
          ["function"] = print,
        }
        for kind, e in pairs(values) do
          it("re-raises a " .. kind .. " error as the very same value and counts it", function()
            local f, b = guard(function() error(e, 0) end, {})
            local ok, got = pcall(f)
            assert.is_false(ok)
            assert.is_true(rawequal(e, got))
            if b then assert.equal(1, b:stats().failures) end
          end)
        end

        it("adds no position to a string error", function()
          local function raiser() error("with position") end
          local _, expected = pcall(raiser)
          local f = guard(raiser, {})
          local _, got = pcall(f)
          assert.equal(expected, got)
          local f0 = guard(function() error("no position", 0) end, {})
          _, got = pcall(f0)
          assert.equal("no position", got)
        end)

        it("re-raises a nil error as nil", function()
          local f, b = guard(function() error(nil) end, {})
          local r = pack(pcall(f))
          assert.is_false(r[1])
          assert.is_nil(r[2])
          if b then assert.equal(1, b:stats().failures) end
        end)

        it("gives the raised value to the fallback, with the arguments", function()
          local e = {}
          local got
          local f = guard(function() error(e) end, {
            fallback = function(...) got = pack(...); return "fb", nil end,
          })
          local r = pack(f("a", nil))
          assert.equal(2, r.n)
          assert.equal("fb", r[1])
          assert.equal(3, got.n)
          assert.is_true(rawequal(e, got[1]))
          assert.equal("a", got[2])
          assert.is_nil(got[3])
        end)
      end)

      describe("nil, err", function()
        it("is a failure, returned unchanged when there is no fallback", function()
          local e = {}
          local f, b = guard(function() return nil, e, "extra", nil end, { fails = 100 })
          local r = pack(f())
          assert.equal(4, r.n)
          assert.is_nil(r[1])
          assert.is_true(rawequal(e, r[2]))
          assert.equal("extra", r[3])
          if b then assert.equal(1, b:stats().failures) end
        end)

        it("goes to the fallback with err and the original arguments", function()
          local got
          local f = guard(function() return nil, "bad" end, {
            fallback = function(...) got = pack(...); return 1, 2, 3 end,
          })
          local r = pack(f(nil, 2, nil))
          assert.same({ n = 3, 1, 2, 3 }, r)
          assert.equal(4, got.n)
          assert.equal("bad", got[1])
          assert.is_nil(got[2])
          assert.equal(2, got[3])
          assert.is_nil(got[4])
        end)

        it("gives the fallback every argument count from 0 to 12 (fixed slots and beyond)", function()
          for n = 0, 12 do
            local got
            local f = guard(function() return nil, "bad" end, {
              fails = 1000, fallback = function(...) got = pack(...); return true end,
            })
            local args = { n = n }
            for i = 1, n do args[i] = (i % 3 ~= 0) and i or nil end
            assert.is_true(f(unpack(args, 1, n)))
            assert.equal(n + 1, got.n, "count with " .. n .. " arguments")
            for i = 1, n do assert.equal(args[i], got[i + 1], "argument " .. i .. " of " .. n) end
          end
        end)

        it("trips the breaker", function()
          local f, b = guard(function() return nil, "bad" end, { fails = 2 })
          f(); f()
          local r, rej = f()
          assert.is_nil(r)
          assert.is_true(fuse.is_rejection(rej))
          if b then assert.equal("open", b:state()) end
        end)
      end)

      describe("fallback", function()
        local arg_lists = {
          { n = 0 }, { nil, n = 1 }, { "a", nil, n = 2 }, { nil, nil, nil, nil, nil, n = 5 },
          { 1, 2, 3, 4, 5, 6, 7, 8, 9, n = 9 },
        }
        for _, args in ipairs(arg_lists) do
          local n = args.n
          it(("gets exactly err and the %d original argument(s), failure and rejection"):format(n), function()
            local got = {}
            local f = guard(function() return nil, "bad" end, {
              fails = 1, fallback = function(...) got[#got + 1] = pack(...); return "fb" end,
            })
            assert.equal("fb", (f(unpack(args, 1, n))))  -- the failure that trips
            assert.equal("fb", (f(unpack(args, 1, n))))  -- a rejection
            for k = 1, 2 do
              assert.equal(n + 1, got[k].n)
              for i = 1, n do assert.equal(args[i], got[k][i + 1]) end
            end
            assert.equal("bad", got[1][1])
            assert.is_true(fuse.is_rejection(got[2][1]))
          end)
        end

        it("is not called on success", function()
          local called = false
          local f = guard(function() return "ok" end, {
            fallback = function() called = true end,
          })
          assert.equal("ok", (f()))
          assert.is_false(called)
        end)

        for _, v in ipairs { "default", 0, false, {} } do
          it("a non-function fallback (" .. type(v) .. " " .. tostring(v) .. ") is returned as is", function()
            local f = guard(function() return nil, "bad" end, { fallback = v, fails = 1 })
            local r = pack(f())
            assert.equal(1, r.n)
            assert.is_true(rawequal(v, r[1]))
            -- now open: the rejection gets the same value
            r = pack(f())
            assert.equal(1, r.n)
            assert.is_true(rawequal(v, r[1]))
          end)
        end

        it("an error raised inside the fallback propagates unchanged (failure)", function()
          local e = {}
          local f = guard(function() error("inner") end, {
            fallback = function() error(e) end,
          })
          local ok, got = pcall(f)
          assert.is_false(ok)
          assert.is_true(rawequal(e, got))
          local g = guard(function() error("inner") end, {
            fallback = function() error("from fallback", 0) end,
          })
          ok, got = pcall(g)
          assert.is_false(ok)
          assert.equal("from fallback", got)
        end)

        it("an error raised inside the fallback propagates unchanged (rejection)", function()
          local e = {}
          local f = guard(function() return nil, "x" end, {
            fails = 1, fallback = function(err) if fuse.is_rejection(err) then error(e) end end,
          })
          f()
          local ok, got = pcall(f)
          assert.is_false(ok)
          assert.is_true(rawequal(e, got))
        end)
      end)

      describe("rejections", function()
        it("are returned as nil, rejection without a fallback", function()
          local calls = 0
          local f = guard(function() calls = calls + 1; return nil, "x" end, {
            fails = 1, open_for = 5,
          })
          f()
          local r = pack(f("arg"))
          assert.equal(1, calls)
          assert.equal(2, r.n)
          assert.is_nil(r[1])
          local rej = r[2]
          assert.is_true(fuse.is_rejection(rej))
          assert.is_nil(rej.name)
          assert.equal("open", rej.state)
          assert.near(5, rej.retry_after, 1e-6)
          assert.equal("fuse: circuit 'anonymous' is open", tostring(rej))
        end)

        it("carry the breaker's name", function()
          local name = unique("rej")
          local f = guard(function() return nil, "x" end, { name = name, fails = 1 })
          f()
          local _, rej = f()
          assert.equal(name, rej.name)
          assert.equal("fuse: circuit '" .. name .. "' is open", tostring(rej))
        end)

        it("go to fallback(rejection, ...) with the original arguments", function()
          local got
          local f = guard(function() return nil, "x" end, {
            fails = 1,
            fallback = function(...) got = pack(...); return "cached", nil end,
          })
          f()
          local r = pack(f(nil, "b", nil))
          assert.same({ n = 2, "cached" }, r)
          assert.equal(4, got.n)
          assert.is_true(fuse.is_rejection(got[1]))
          assert.equal("open", got[1].state)
          assert.is_nil(got[2])
          assert.equal("b", got[3])
          assert.is_nil(got[4])
        end)
      end)

      describe("coroutines", function()
        if not PCALL_YIELDS then
          -- (docs/api.md, fuse.wrap: what Lua 5.1 users get, the one difference of calls)
          it(_VERSION .. " cannot yield across pcall: a yield in fn raises there, a failure", function()
            local f, b = guard(function() coroutine.yield("waiting") end, {})
            local co = coroutine.create(function() return f() end)
            local ok, err = coroutine.resume(co)
            assert.is_false(ok)
            assert.matches("attempt to yield across", tostring(err), 1, true)
            assert.equal("dead", coroutine.status(co))
            if b then assert.equal(1, b:stats().failures_total) end
          end)
          return
        end

        it("the guarded fn may yield mid-call; the result passes through and is counted", function()
          local f, b = guard(function(x)
            local y = coroutine.yield("waiting", x)
            return x + y, nil
          end, {})
          local co = coroutine.create(function(x) return f(x) end)
          local r = pack(coroutine.resume(co, 1))
          assert.same({ n = 3, true, "waiting", 1 }, r)
          assert.equal("suspended", coroutine.status(co))
          r = pack(coroutine.resume(co, 41))
          assert.same({ n = 3, true, 42 }, r)
          assert.equal("dead", coroutine.status(co))
          if b then
            assert.equal(1, b:stats().successes_total)
            assert.equal(1, b:stats().calls)
          end
        end)

        it("a failure after a yield is counted and goes to the fallback", function()
          local f, b = guard(function()
            coroutine.yield()
            error("late", 0)
          end, { fails = 1, fallback = function(err, a) return "fb:" .. err .. ":" .. a end })
          local co = coroutine.wrap(function(a) return f(a) end)
          co("A")
          assert.equal("fb:late:A", co())
          if b then assert.equal("open", b:state()) end
        end)

        it("interleaved coroutines keep their own outcomes", function()
          local f, b = guard(function(fail)
            coroutine.yield()
            if fail then return nil, "bad" end
            return "good"
          end, { fails = 10 })
          local c1 = coroutine.create(function() return f(true) end)
          local c2 = coroutine.create(function() return f(false) end)
          coroutine.resume(c1); coroutine.resume(c2)
          local _, a1, a2 = coroutine.resume(c2)
          assert.equal("good", a1)
          assert.is_nil(a2)
          local _, b1, b2 = coroutine.resume(c1)
          assert.is_nil(b1)
          assert.equal("bad", b2)
          if b then
            local s = b:stats()
            assert.equal(1, s.successes_total)
            assert.equal(1, s.failures_total)
          end
        end)
      end)

      describe("is_failure", function()
        it("receives (true, results...) and (false, err)", function()
          local seen = {}
          local e = {}
          local mode
          local f = guard(function()
            if mode == "raise" then error(e) end
            return 1, nil, 3, nil
          end, { is_failure = function(...) seen[#seen + 1] = pack(...); return false end })
          f()
          mode = "raise"
          pcall(f)
          assert.equal(5, seen[1].n)
          assert.is_true(seen[1][1])
          assert.equal(1, seen[1][2])
          assert.equal(3, seen[1][4])
          assert.is_false(seen[2][1])
          assert.is_true(rawequal(e, seen[2][2]))
        end)

        it("true makes a success-looking result a failure (fallback called)", function()
          local fb_called = false
          local f, b = guard(function() return { status = 500 } end, {
            fails = 2,
            is_failure = function(ok, res) return ok and res.status >= 500 end,
            fallback = function() fb_called = true; return "fb" end,
          })
          assert.equal("fb", (f()))
          assert.is_true(fb_called)
          if b then assert.equal(1, b:stats().failures) end
          f()
          if b then assert.equal("open", b:state()) end
        end)

        it("true without a fallback returns the results unchanged", function()
          local res = { status = 503 }
          local f, b = guard(function() return res, "x" end, {
            is_failure = function() return true end,
          })
          local r = pack(f())
          assert.equal(2, r.n)
          assert.is_true(rawequal(res, r[1]))
          assert.equal("x", r[2])
          if b then assert.equal(1, b:stats().failures) end
        end)

        it("a raised error it calls a success is re-raised, without fallback, counted as success", function()
          local e = {}
          local fb_called = false
          local f, b = guard(function() error(e) end, {
            is_failure = function() return false end,
            fallback = function() fb_called = true end,
          })
          local ok, got = pcall(f)
          assert.is_false(ok)
          assert.is_true(rawequal(e, got))
          assert.is_false(fb_called)
          if b then
            local s = b:stats()
            assert.equal(0, s.failures_total)
            assert.equal(1, s.successes_total)
          end
        end)

        it("a raised error it ignores is re-raised, without fallback, counted nowhere", function()
          local e = {}
          local fb_called = false
          local f, b = guard(function() error(e) end, {
            is_failure = function() return nil end,
            fallback = function() fb_called = true end,
          })
          local ok, got = pcall(f)
          assert.is_false(ok)
          assert.is_true(rawequal(e, got))
          assert.is_false(fb_called)
          if b then
            local s = b:stats()
            assert.equal(0, s.calls)
            assert.equal(0, s.calls_total)
          end
        end)

        it("a nil, err it calls a failure goes to the fallback", function()
          local got
          local f, b = guard(function() return nil, "e" end, {
            is_failure = function(ok, a, c) return ok and a == nil and c ~= nil end,
            fallback = function(...) got = pack(...); return "fb" end,
          })
          assert.equal("fb", (f("arg")))
          assert.equal("e", got[1])
          assert.equal("arg", got[2])
          if b then assert.equal(1, b:stats().failures) end
        end)

        it("a nil, err it calls a success is returned unchanged, without fallback", function()
          local fb_called = false
          local f, b = guard(function() return nil, "not found" end, {
            fails = 1,
            is_failure = function() return false end,
            fallback = function() fb_called = true end,
          })
          for _ = 1, 3 do
            local r = pack(f())
            assert.same({ n = 2, nil, "not found" }, r)
          end
          assert.is_false(fb_called)
          if b then
            assert.equal("closed", b:state())
            assert.equal(3, b:stats().successes_total)
          end
        end)

        it("nil ignores a result: not counted, results unchanged", function()
          local f, b = guard(function() return nil, "bad" end, {
            fails = 1, is_failure = function() return nil end,
          })
          local r = pack(f())
          assert.same({ n = 2, nil, "bad" }, r)
          if b then
            assert.equal("closed", b:state())
            assert.equal(0, b:stats().calls_total)
          end
        end)
      end)

      describe("the default failure rule", function()
        local cases = {
          { "nothing", function() end, false },
          { "nil", function() return nil end, false },
          { "nil, nil", function() return nil, nil end, false },
          { "false, 'x'", function() return false, "x" end, false },
          { "false", function() return false end, false },
          { "nil, false", function() return nil, false end, true },
          { "nil, 'err'", function() return nil, "err" end, true },
          { "nil, nil, 'x'", function() return nil, nil, "x" end, false },
        }
        for _, case in ipairs(cases) do
          local label, fn, is_failure = case[1], case[2], case[3]
          it(("returning %s is a %s"):format(label, is_failure and "failure" or "success"), function()
            local f, b = guard(fn, { fails = 1 })
            local expected = pack(fn())
            local r = pack(f())
            assert.same(expected, r)
            r = pack(f())
            if is_failure then
              assert.is_true(fuse.is_rejection(r[2]))
            else
              assert.same(expected, r)
            end
            if b then
              assert.equal(is_failure and "open" or "closed", b:state())
            end
          end)
        end
      end)
    end)
  end

  describe("b:wrap", function()
    it("uses the breaker's fallback when none is given, and the given one otherwise", function()
      local b = fuse.new { fails = 1, fallback = function() return "breaker's" end }
      local f1 = b:wrap(function() return nil, "x" end)
      local f2 = b:wrap(function() return nil, "x" end, function() return "wrap's" end)
      assert.equal("breaker's", (f1()))
      -- now open: both wraps share the breaker
      assert.equal("breaker's", (f1()))
      assert.equal("wrap's", (f2()))
    end)

    it("uses the breaker's is_failure", function()
      local b = fuse.new { fails = 1, is_failure = function() return false end }
      local f = b:wrap(function() error("x", 0) end)
      pcall(f)
      assert.equal("closed", b:state())
    end)
  end)

  -- error(msg, 2) in fn names fn's caller: fuse's trampoline under LuaJIT (a Lua frame,
  -- which keeps fn out of trace roots), pcall under PUC Lua (no position); level 0 is
  -- the same text under both (docs/api.md, fuse.wrap)
  describe("an error fn raises with a level", function()
    it("level 2: fuse.lua's line under LuaJIT, no position under PUC Lua; level 0: the text", function()
      local _, err = pcall(fuse.wrap(function() error("level two", 2) end))
      if BACKEND == "ffi" then assert.matches("^[^\n]*fuse%.lua:%d+: level two$", err)
      else assert.equal("level two", err) end
      _, err = pcall(fuse.wrap(function() error("level zero", 0) end))
      assert.equal("level zero", err)
    end)
  end)

  describe("fuse.is_rejection", function()
    it("is true only for rejections", function()
      local f = fuse.wrap(function() return nil, "x" end, { fails = 1 })
      f()
      local _, rej = f()
      assert.is_true(fuse.is_rejection(rej))
      local copy = {}
      for k, v in pairs(rej) do copy[k] = v end
      assert.is_false(fuse.is_rejection(copy))
      assert.is_false(fuse.is_rejection({ name = "x", state = "open", retry_after = 1 }))
      assert.is_false(fuse.is_rejection(nil))
      assert.is_false(fuse.is_rejection("fuse: circuit 'anonymous' is open"))
      assert.is_false(fuse.is_rejection(42))
      assert.is_false(fuse.is_rejection(false))
    end)

    it("tostring reads 'is open' in every rejecting state", function()
      local name = unique("tostr")
      local b = fuse.new { name = name, fails = 1, open_for = 5, probes = 1 }
      b:force_open()
      local _, rej = b:allow()
      assert.equal("forced_open", rej.state)
      assert.equal(0, rej.retry_after)
      assert.equal("fuse: circuit '" .. name .. "' is open", tostring(rej))
      b:reset()
      b:call(function() return nil, "x" end)
      clock:advance(5.01)
      assert.is_number((b:allow()))
      _, rej = b:allow()
      assert.equal("half_open", rej.state)
      assert.equal("fuse: circuit '" .. name .. "' is open", tostring(rej))
    end)
  end)

  describe("on_state_change", function()
    it("is called once per transition, with (name, from, to), by the wrap that made it", function()
      local name = unique("osc")
      local log_a, log_b = {}, {}
      local mode = "fail"
      local fn = function()
        if mode == "fail" then return nil, "x" end
        return "ok"
      end
      local opts = { name = name, fails = 2, open_for = 5 }
      local function with(log)
        local o = {}
        for k, v in pairs(opts) do o[k] = v end
        o.on_state_change = function(...) log[#log + 1] = pack(...) end
        return o
      end
      local fa = fuse.wrap(fn, with(log_a))
      local fb = fuse.wrap(fn, with(log_b))
      fb()
      fa()  -- this one trips
      assert.equal(1, #log_a)
      assert.same({ n = 3, name, "closed", "open" }, log_a[1])
      assert.equal(0, #log_b)
      fa(); fb()  -- rejections: no transition
      assert.equal(1, #log_a)
      assert.equal(0, #log_b)
      clock:advance(5.01)
      mode = "ok"
      assert.equal("ok", (fb()))  -- open -> half_open -> closed, both made by fb
      assert.equal(2, #log_b)
      assert.same({ n = 3, name, "open", "half_open" }, log_b[1])
      assert.same({ n = 3, name, "half_open", "closed" }, log_b[2])
      assert.equal(1, #log_a)
    end)

    it("passes a nil name for an anonymous breaker", function()
      local log = {}
      local f = fuse.wrap(function() return nil, "x" end, {
        fails = 1, on_state_change = function(...) log[#log + 1] = pack(...) end,
      })
      f()
      assert.same({ { n = 3, nil, "closed", "open" } }, log)
    end)

    it("is called for a failed probe (half_open -> open)", function()
      local log = {}
      local f = fuse.wrap(function() return nil, "x" end, {
        fails = 1, open_for = 5,
        on_state_change = function(_, from, to) log[#log + 1] = from .. ">" .. to end,
      })
      f()
      clock:advance(5.01)
      f()
      assert.same({ "closed>open", "open>half_open", "half_open>open" }, log)
    end)

    it("fires once for a transition made by b:state() (time alone)", function()
      local log = {}
      local b = fuse.new { fails = 1, open_for = 5,
        on_state_change = function(_, from, to) log[#log + 1] = from .. ">" .. to end }
      b:call(function() return nil, "x" end)
      clock:advance(5.01)
      assert.equal("half_open", b:state())
      assert.equal("half_open", b:state())
      assert.equal("half_open", b:stats().state)
      assert.same({ "closed>open", "open>half_open" }, log)
    end)

    it("fires half_open -> open when the next call finds a probe past probe_timeout", function()
      local log = {}
      local f, b = fuse.wrap(function() return "ok" end, { fails = 1, open_for = 5, probe_timeout = 2,
        on_state_change = function(_, from, to) log[#log + 1] = from .. ">" .. to end })
      b:force_open()
      b:reset()
      log = {}
      b:call(function() return nil, "x" end)
      clock:advance(5.01)
      local t = b:allow()
      assert.is_number(t)
      clock:advance(2.01)
      local r, rej = f()
      assert.is_nil(r)
      assert.equal("open", rej.state)
      assert.same({ "closed>open", "open>half_open", "half_open>open" }, log)
    end)

    it("fires for force_open and disable, with the state they left", function()
      local log = {}
      local b = fuse.new { fails = 1,
        on_state_change = function(_, from, to) log[#log + 1] = from .. ">" .. to end }
      b:force_open()
      b:disable()
      b:reset()
      assert.same({ "closed>forced_open", "forced_open>disabled", "disabled>closed" }, log)
    end)

    it("an error inside it goes to fuse.report_error, and the call returns normally", function()
      local reported = {}
      local saved = fuse.report_error
      fuse.report_error = function(msg) reported[#reported + 1] = msg end
      local f = fuse.wrap(function() return nil, "x" end, {
        name = unique("osc-err"), fails = 1,
        on_state_change = function() error("listener broke", 0) end,
      })
      local ok, r1, r2 = pcall(f)
      fuse.report_error = saved
      assert.is_true(ok)
      assert.is_nil(r1)
      assert.equal("x", r2)
      assert.equal(1, #reported)
      assert.matches("listener broke", reported[1], 1, true)
      assert.matches("closed", reported[1], 1, true)
      assert.matches("open", reported[1], 1, true)
    end)

    it("an error inside it on the rejection path never breaks the call either", function()
      local reported = {}
      local saved = fuse.report_error
      fuse.report_error = function(msg) reported[#reported + 1] = msg end
      local b = fuse.new { fails = 1, open_for = 5, probes = 1,
        on_state_change = function(_, _, to) if to == "half_open" then error({}) end end }
      b:call(function() return nil, "x" end)
      clock:advance(5.01)
      local ok, t = pcall(b.allow, b)
      fuse.report_error = saved
      assert.is_true(ok)
      assert.is_number(t)
      assert.equal(1, #reported)
    end)

    it("an error inside it is written to io.stderr by default", function()
      local f = fuse.wrap(function() return nil, "x" end, {
        fails = 1, on_state_change = function() error("listener broke") end,
      })
      local stderr = io.stderr
      local written = {}
      -- capture whatever the implementation reports on stderr
      io.stderr = { write = function(self, ...) -- luacheck: ignore 122
        for i = 1, select("#", ...) do written[#written + 1] = tostring((select(i, ...))) end
        return self
      end }
      local ok, r1, r2 = pcall(f)
      io.stderr = stderr -- luacheck: ignore 122
      assert.is_true(ok)
      assert.is_nil(r1)
      assert.equal("x", r2)
      local all = table.concat(written)
      assert.matches("listener broke", all, 1, true)
    end)
  end)
end)
