-- Misuse and limits of the Lua API: a method called with a self that is not a breaker
-- raises (under LuaJIT it used to hand the core a NULL breaker: a crash), rejections are
-- read-only, a second `require "fuse"` in one VM works, and a guarded call takes and
-- returns as many values as a bare call.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

local unpack = table.unpack or unpack  -- luacheck: ignore 143

-- values(n): 1, 2, ..., n as values, for any n the stack can hold (unpack stops at 8000
-- under LuaJIT and Lua 5.1): beyond 7000 the rest go in front 50 at a time, through a
-- tail call that takes them as fixed arguments.
local values
do
  local slots = {}
  for j = 49, 0, -1 do slots[#slots + 1] = "i - " .. j end
  local step = assert((rawget(_G, "loadstring") or load)(([[
    local step
    step = function(i, ...)
      if i >= 50 then return step(i - 50, %s, ...) end
      if i == 0 then return ... end
      return step(i - 1, i, ...)
    end
    return step]]):format(table.concat(slots, ", "))))()
  local t = {}
  values = function(n)
    local first = math.max(n - 7000, 0)
    for i = first + 1, n do t[i] = i end
    return step(first, unpack(t, first + 1, n))
  end
end

-- whether the values are 1..n (the first two and the last two are checked), and n; with
-- no more than two copies of them on the stack at a time, as a bare call makes
local function check_values(...)
  local n = select("#", ...)
  local a1, a2 = ...
  local z1, z2 = select(n > 1 and n - 1 or 1, ...)
  return a1 == 1 and a2 == 2 and z1 == n - 1 and z2 == n, n
end

local function identity(...) return ... end

local unique = support.unique_names("s13")

describe("fuse #" .. BACKEND, function()
  support.fake_clock(1000)

  support.it_runs_on_backend()

  describe("a method called with a self that is not a breaker", function()
    -- every method of a breaker object, so that a new method cannot forget the check
    local b0 = fuse.new { fails = 5 }
    local methods = {}
    for name, fn in pairs(getmetatable(b0).__index) do
      if type(fn) == "function" then methods[#methods + 1] = name end
    end
    table.sort(methods)

    local ARGS = { call = { identity }, wrap = { identity }, report = { 128, true } }

    it("finds the methods to check", function()
      for _, m in ipairs { "allow", "call", "disable", "force_open", "report", "reset", "state",
        "stats", "wrap" } do
        assert.is_truthy(getmetatable(b0).__index[m], m)
      end
    end)

    for _, m in ipairs(methods) do
      for _, case in ipairs {
        { "a table", function() return {} end },
        { "nil (b." .. m .. "() for b:" .. m .. "())", function() return nil end },
        { "a number", function() return 128 end },
        { "a string", function() return "users" end },
        { "another object's metatable", function() return setmetatable({ _h = false }, {}) end },
      } do
        it(("b.%s(%s) raises 'fuse: call b:%s(), not b.%s()', at the caller's line"):format(m,
          case[1], m, m), function()
          local b = fuse.new { fails = 5 }
          local args = ARGS[m] or {}
          local ok, err = pcall(function()
            local r = b[m](case[2](), unpack(args, 1, 2))  -- the line the error must name
            return r
          end)
          assert.is_false(ok)
          assert.is_string(err)
          assert.is_truthy(err:find("fuse: call b:" .. m .. "(), not b." .. m .. "()", 1, true), err)
          assert.is_truthy(err:find("13%-api_hardening_spec%.lua:%d+:"), err)
          -- and the breaker is untouched
          assert.equal("closed", b:state())
          assert.equal(0, b:stats().calls)
        end)
      end
    end

    it("costs a correct call nothing it can see: results and counts as before", function()
      local b = fuse.new { fails = 5 }
      assert.equal(3, b:call(identity, 3))
      support.succeed(b, 2)
      assert.equal(3, b:stats().successes_total)
    end)
  end)

  describe("a rejection", function()
    local function rejected_pair()
      local name = unique("rej")
      local f, b = fuse.wrap(function() return nil, "down" end, { name = name, fails = 1, open_for = 30 })
      f()
      local _, r1 = f()
      return f, b, r1, name
    end

    for _, case in ipairs {
      { "retry_after", 0 }, { "name", "x" }, { "state", "closed" }, { "anything", 1 },
    } do
      it(("is read-only: r.%s = %s raises 'fuse: ...', and changes nothing"):format(case[1],
        tostring(case[2])), function()
        local f, _, r, name = rejected_pair()
        local ok, err = pcall(function() r[case[1]] = case[2] end)
        assert.is_false(ok)
        assert.is_truthy(tostring(err):find("fuse: a rejection is read-only", 1, true), tostring(err))
        assert.is_truthy(tostring(err):find("13%-api_hardening_spec%.lua:%d+:"), tostring(err))
        local _, later = f()
        assert.equal(r, later)  -- still the one shared object
        assert.equal(name, later.name)
        assert.equal("open", later.state)
        assert.equal(30, later.retry_after)
        assert.is_nil(later.anything)
        assert.equal("fuse: circuit '" .. name .. "' is open", tostring(later))
        assert.is_true(fuse.is_rejection(later))
      end)
    end

    it("keeps reading name, state and a live retry_after", function()
      local clock = { now = 0 }
      fuse.clock(function() return clock.now end)
      local f = fuse.wrap(function() return nil, "down" end, { fails = 1, open_for = 10 })
      f()
      local _, r = f()
      assert.is_nil(r.name)
      assert.equal("open", r.state)
      assert.equal(10, r.retry_after)
      clock.now = 4
      assert.equal(6, r.retry_after)
    end)
  end)

  describe("a second require of fuse in the same VM", function()
    -- In a fresh interpreter, the one running this spec: busted replaces ffi.cdef with one
    -- that accepts a redefinition, which would hide the failure.
    local interpreter
    for i = -1, -10, -1 do
      if arg and arg[i] and not (arg[i - 1]) then interpreter = arg[i] break end
    end

    local CHILD = [[
      local fuse = require "fuse"
      local name = "s13-reload"
      local b1 = fuse.new { name = name, fails = 2 }
      local saved = {}
      for k, mod in pairs(package.loaded) do
        if k == "fuse" or k:find("^fuse%.") then saved[k] = mod end
      end
      for k in pairs(saved) do package.loaded[k] = nil end
      local fuse2 = require "fuse"
      assert(fuse2 ~= fuse, "the second require returned the first module")
      local f, b = fuse2.wrap(function(x) return x * 2 end, { fails = 2 })
      assert(f(21) == 42 and b:stats().successes_total == 1, "a wrap of the second copy")
      -- named breakers live in the core: both copies see one breaker
      local b2 = fuse2.new { name = name, fails = 2 }
      local t = b1:allow()
      b1:report(t, false)
      assert(b2:stats().failures_total == 1, "the copies do not share the named breaker")
      -- and the first copy keeps working
      assert(fuse.wrap(function(x) return x end, {})(7) == 7, "the first copy broke")
      print("reloaded " .. fuse2._backend)
    ]]

    it("works after package.loaded is cleared (code reload, a vendored copy)", function()
      assert.is_string(interpreter, "cannot tell which interpreter runs this spec")
      local q = function(x) return "'" .. tostring(x):gsub("'", "'\\''") .. "'" end
      local setup = ("package.path = %q; package.cpath = %q; "):format(package.path, package.cpath)
      local cmd = q(interpreter) .. " -e " .. q(setup .. CHILD) .. " 2>&1"
      local out = assert(io.popen(cmd)):read("*a")
      assert.equal("reloaded " .. BACKEND .. "\n", out)
    end)
  end)

  describe("many values", function()
    local N = 24000  -- a bare call passes these on every backend (LuaJIT: up to ~32,700 at the top level)

    it("the helper makes them, and a bare call passes them (the baseline)", function()
      assert.same({ true, N }, { check_values(values(N)) })
      assert.same({ true, N }, { check_values(identity(values(N))) })
      local function fallback(_, ...) return check_values(...) end
      assert.same({ true, N }, { fallback("err", values(N)) })
    end)

    local FORMS = {
      ["fuse.wrap"] = function(fn, opts) return fuse.wrap(fn, opts) end,
      ["b:wrap"] = function(fn, opts)
        local fb = opts.fallback
        opts.fallback = nil
        local b = fuse.new(opts)
        return b:wrap(fn, fb), b
      end,
      ["b:call"] = function(fn, opts)
        local b = fuse.new(opts)
        return function(...) return b:call(fn, ...) end, b
      end,
    }

    for _, form in ipairs { "fuse.wrap", "b:wrap", "b:call" } do
      local guard = FORMS[form]

      it(form .. ": an identity function returns " .. N .. " results, counted as a success", function()
        local f, b = guard(identity, { fails = 5 })
        assert.same({ true, N }, { check_values(f(values(N))) })
        local s = b:stats()
        assert.equal(1, s.successes_total)
        assert.equal(0, s.failures_total)
      end)

      it(form .. ": with a fallback, too", function()
        local f, b = guard(identity, { fails = 5, fallback = function() return "fallback" end })
        assert.same({ true, N }, { check_values(f(values(N))) })
        assert.equal(0, b:stats().failures_total)
      end)

      for _, n in ipairs { 9, 1000, 1001, 8000, N } do
        it(("%s: a failing call with %d arguments reaches its fallback with all of them"):format(form, n), function()
          local got
          local f, b = guard(function() return nil, "down" end, { fails = 1000000,
            fallback = function(err, ...) got = err return check_values(...) end })
          assert.same({ true, n }, { f(values(n)) })
          assert.equal("down", got)
          assert.equal(1, b:stats().failures_total)
        end)

        it(("%s: a raising call with %d arguments gets them too"):format(form, n), function()
          local got
          local f = guard(function() error("boom", 0) end, { fails = 1000000,
            fallback = function(err, ...) got = err return check_values(...) end })
          assert.same({ true, n }, { f(values(n)) })
          assert.equal("boom", got)
        end)

        it(("%s: a call with %d arguments passes them all to the function"):format(form, n), function()
          local f, b = guard(function(...) return check_values(...) end, { fails = 5 })
          assert.same({ true, n }, { f(values(n)) })
          assert.equal(1, b:stats().successes_total)
        end)
      end

      it(form .. ": a rejected call with " .. N .. " arguments gives them all to the fallback", function()
        local got
        local f, b = guard(function() return nil, "down" end, { fails = 1,
          fallback = function(err, ...) got = fuse.is_rejection(err) return check_values(...) end })
        f()
        assert.same({ true, N }, { f(values(N)) })
        assert.is_true(got)
        assert.equal(1, b:stats().rejections_total)
      end)
    end
  end)
end)
