-- Every message of fuse's shows a value the one way fuse.options does (options.show): a
-- string in quotes, so that "5" never reads as the number 5; numbers alike under every
-- Lua ("nan", never glibc's "-nan"; "20", not 5.4's "20.0"); the type for the rest; and
-- valid UTF-8 whatever the bytes (those that are not UTF-8 as \xHH, as fuse.metrics()
-- writes names).
local fuse = require "fuse"
local options = require "fuse.options"
local upstream = require "fuse.upstream"
local support = require "spec.support"
local BACKEND = support.BACKEND

local NAN = 0 / 0

local function message(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "did not raise")
  return tostring(err)
end

describe("messages #" .. BACKEND, function()
  support.it_runs_on_backend()

  describe("options.show", function()
    local cases = {
      { "5", '"5"' }, { 5, "5" }, { 20.0, "20" }, { 0.1, "0.1" }, { NAN, "nan" }, { -NAN, "nan" },
      { 1 / 0, "inf" }, { -1 / 0, "-inf" }, { true, "true" }, { nil, "nil" }, { {}, "table" },
      { print, "function" }, { 'a"b', '"a\\"b"' }, { "a\\b", '"a\\\\b"' }, { "a\nb\0", '"a\\nb\\000"' },
      { "caf\233", '"caf\\xE9"' }, { "caf\195\169", '"caf\195\169"' }, { "\237\160\128", '"\\xED\\xA0\\x80"' },
    }
    for _, c in ipairs(cases) do
      it(("shows a %s as %s"):format(type(c[1]), c[2]), function()
        assert.equal(c[2], options.show(c[1]))
      end)
    end

    -- Lua 5.3+: an integer past 2^53 by all its digits, never the float it rounds to
    -- (two values that differ never print alike)
    it("shows a Lua 5.3+ integer past 2^53 by its own digits", function()
      local big = rawget(math, "type") and load("return 9007199254740993, math.maxinteger, math.mininteger")
      if not big then return end  -- (no integer subtype: LuaJIT, Lua 5.1)
      local a, b, c = big()
      assert.equal("9007199254740993 9223372036854775807 -9223372036854775808",
        options.show(a) .. " " .. options.show(b) .. " " .. options.show(c))
      assert.equal("fuse: option 'fails' must be an integer from 1 to 1000000, got 9007199254740993",
        (message(fuse.new, { fails = a }):gsub("^.-: fuse", "fuse")))
    end)

    it("cuts a long string after 60 bytes, never inside a character", function()
      local s = ("x"):rep(59) .. "\226\130\172" .. ("y"):rep(10)  -- € across bytes 60-62
      assert.equal('"' .. ("x"):rep(59) .. '..."', options.show(s))
      assert.equal('"' .. ("z"):rep(60) .. '..."', options.show(("z"):rep(61)))
    end)

    it("writes names as the metrics do: options.utf8_text, one text per name", function()
      assert.equal("plain-name", options.utf8_text("plain-name"))
      assert.equal("caf\195\169", options.utf8_text("caf\195\169"))
      assert.equal("caf\\xE9", options.utf8_text("caf\233"))
      assert.equal("a\\\\b", options.utf8_text("a\\b"))
      assert.equal("a\\\\xE9", options.utf8_text("a\\xE9"))  -- the bytes \xE9: not the same text
      fuse.new { name = "s19-caf\233", fails = 3 }
      assert.truthy(fuse.metrics():find('fuse_state{name="s19-caf\\\\xE9"}', 1, true))
    end)
  end)

  describe("raised by the API outside fuse.options", function()
    local b = fuse.new { fails = 3 }
    local rej
    before_each(function()
      b:reset()
      b:force_open()
      rej = select(2, b:call(function() end))
      b:reset()
    end)

    local cases = {
      { "force_open's seconds", function() b:force_open("5") end, 'got "5"' },
      { "force_open's seconds", function() b:force_open(NAN) end, "got nan" },
      { "report's seconds", function() b:report(b:allow(), true, "1") end, 'got "1"' },
      { "report's seconds", function() b:report(b:allow(), true, NAN) end, "got nan" },
      { "report's ok", function() b:report(b:allow(), "yes") end, 'got "yes"' },
      { "report's ticket", function() b:report("7", true) end, 'got "7"' },
      { "a ticket not issued", function() b:report(2 ^ 40 + 6, true) end, "report: 1099511627782 is not a ticket" },
      { "fuse.events' since", function() fuse.events(NAN) end, "got nan" },
      { "fuse.events' since", function() fuse.events("3") end, 'got "3"' },
      { "fuse.get's name", function() fuse.get(42) end, "got 42" },
      { "fuse.remove's name", function() fuse.remove(false) end, "got false" },
      { "fuse.wrap's function", function() fuse.wrap("f") end, 'needs a function, got "f"' },
      { "fuse.clock's function", function() fuse.clock("f") end, 'got "f"' },
      { "the clock's reading", function() fuse.clock(function() return NAN end) end, "got nan" },
      { "the clock's reading", function() fuse.clock(function() return "5" end) end, 'got "5"' },
      { "is_failure's answer", function()
        fuse.new { fails = 3, is_failure = function() return "yes" end }:call(function() end)
      end, 'is_failure must return true, false or nil, got "yes"' },
      { "fuse.reject's rejection", function() fuse.reject("x") end, 'got "x"' },
      { "fuse.reject's status", function() fuse.reject(rej, "503") end, 'got "503"' },
      { "fuse.reject's status", function() fuse.reject(rej, NAN) end, "got nan" },
      { "fuse.watch's function", function() fuse.watch("f") end, 'got "f"' },
      { "fuse.watch's interval", function() fuse.watch(print, "1") end, 'got "1"' },
      { "fuse.watch's interval", function() fuse.watch(print, NAN) end, "got nan" },
      { "fuse.upstream's weight", function()
        upstream.new("s19", { { addr = "10.9.9.9:1", weight = "2" } })
      end, 'got "2"' },
      { "fuse.upstream's max_ejected", function()
        upstream.new("s19", { "10.9.9.9:1" }, { max_ejected = NAN })
      end, "got nan" },
      { "fuse.upstream's addr", function() upstream.new("s19", { "caf\233:80" }) end, 'got "caf\\xE9:80"' },
    }
    for _, c in ipairs(cases) do
      it(("%s: ...%s"):format(c[1], c[3]), function()
        local err = message(c[2])
        assert.truthy(err:find(c[3], 1, true), err)
        assert.is_nil(err:find("-nan", 1, true), err)
      end)
    end
  end)

  -- Each raised at the line that called fuse (under Lua 5.1, fuse.admin, fuse.reject
  -- and fuse.watch named a frame without a line: their wrappers' tail calls).
  describe("raised at the caller's line", function()
    local b = fuse.new { fails = 3 }
    b:force_open()
    local rej = select(2, b:call(function() end))
    local cases = {
      { "fuse.admin's options", function() fuse.admin { tokn = "x" } end },
      { "fuse.admin's options", function() fuse.admin("x") end },
      { "fuse.reject's rejection", function() fuse.reject("x") end },
      { "fuse.reject's status", function() fuse.reject(rej, 200) end },
      { "fuse.watch's function", function() fuse.watch("f") end },
      { "fuse.watch's interval", function() fuse.watch(print, 0) end },
      { "fuse.events' since", function() fuse.events(-1) end },
      { "fuse.get's name", function() fuse.get(42) end },
      { "fuse.remove's name", function() fuse.remove(42) end },
      { "fuse.init's options", function() fuse.init { capacity = 0 } end },
    }
    if not rawget(_G, "ngx") then
      cases[#cases + 1] = { "fuse.admin outside nginx", function() fuse.admin() end }
      cases[#cases + 1] = { "fuse.reject outside nginx", function() fuse.reject(rej) end }
      cases[#cases + 1] = { "fuse.watch outside nginx", function() fuse.watch(print) end }
    end
    for _, c in ipairs(cases) do
      it(c[1], function()
        local line = debug.getinfo(c[2], "S").linedefined
        local err = message(c[2])
        assert.truthy(err:find("20%-messages_spec%.lua:" .. line .. ": fuse: "), err)
      end)
    end
  end)
end)
