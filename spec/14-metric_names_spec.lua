-- fuse.metrics() with breaker names of any bytes: every byte 1..255, control
-- characters, and byte sequences that are not UTF-8. The exposition must pass
-- `promtool check metrics` (a name that is not UTF-8 used to fail the whole scrape),
-- every name must have a label value of its own, and that value must read back to it.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

local char = string.char

local promtool = support.promtool   -- `promtool check metrics`: status, output (nil: none)

-- The label values of `name` in family fuse_state, as Prometheus reads them (the text
-- format's escapes \\, \" and \n undone), in order.
local function state_labels(text)
  local out = {}
  for line in text:gmatch("([^\n]*)\n") do
    local raw = line:match('^fuse_state{name="(.*)"} %S+$')
    if raw then
      out[#out + 1] = (raw:gsub('\\(.)', { ["\\"] = "\\", ['"'] = '"', n = "\n" }))
    end
  end
  return out
end

-- Reads a label value back to the name: as is without a backslash, else with \xHH
-- turned into the byte and \\ into one backslash.
local function read_back(v)
  if not v:find("\\", 1, true) then return v end
  return (v:gsub("\\(.)(%x?%x?)", function(c, hex)
    if c == "x" then return char(tonumber(hex, 16)) end
    return c .. hex
  end))
end

-- Whether s is valid UTF-8, by a decoder of its own (RFC 3629).
local function is_utf8(s)
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    local len, lo, hi = 1, 0x80, 0xBF
    if c >= 0x80 then
      if c >= 0xC2 and c <= 0xDF then len = 2
      elseif c >= 0xE0 and c <= 0xEF then len = 3
      elseif c >= 0xF0 and c <= 0xF4 then len = 4
      else return false end
      if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F
      elseif c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
      for k = 1, len - 1 do
        local ck = s:byte(i + k)
        local l, h = 0x80, 0xBF
        if k == 1 then l, h = lo, hi end
        if not ck or ck < l or ck > h then return false end
      end
    end
    i = i + len
  end
  return true
end

describe("fuse #" .. BACKEND, function()
  support.it_runs_on_backend()

  describe("fuse.metrics() with names of any bytes", function()
    local names = {}

    setup(function()
      local function add(name)
        names[#names + 1] = name
        if not fuse.get(name) then fuse.new{ name = name, fails = 2 } end
      end
      for b = 1, 255 do
        add("spec14-" .. char(b) .. "-" .. b)           -- the byte inside a name
        add("spec14-end-" .. b .. char(b))              -- the byte last
        add(char(b))                                    -- the byte alone
      end
      for _, s in ipairs({
        "caf\233", "café", "日本", "\240\159\152\128", -- Latin-1, UTF-8, 4 bytes
        "\192\128", "\224\128\128", "\237\160\128",    -- overlong, overlong, surrogate
        "\244\144\128\128", "\248\136\128\128\128",    -- above U+10FFFF, 5 bytes
        "\226\130", "x\226\130", "\128\191",           -- truncated, continuation bytes
        "\1\2\3\t\r\27\127", "a\nb", "q\"uote",        -- control characters
        "back\\slash", "back\\slash\233", "caf\\xE9", "\\x41", "\\",
      }) do add(s) end
    end)

    it("passes `promtool check metrics`", function()
      local rc, out = promtool(fuse.metrics())
      if rc == nil then
        if os.getenv("CI") == "true" then error("promtool is not installed (CI=true)") end
        pending("promtool is not installed")
        return
      end
      assert.equal(0, rc, out)
    end)

    it("writes every label value as UTF-8", function()
      for _, v in ipairs(state_labels(fuse.metrics())) do
        assert.is_true(is_utf8(v), ("label value %q is not UTF-8"):format(v))
      end
    end)

    it("gives each name a label value of its own, which reads back to the name", function()
      local values, by_value = state_labels(fuse.metrics()), {}
      for _, v in ipairs(values) do
        assert.is_nil(by_value[v], ("two breakers share the label value %q"):format(v))
        by_value[v] = true
      end
      local back = {}
      for _, v in ipairs(values) do back[read_back(v)] = v end
      for _, name in ipairs(names) do
        assert.is_truthy(back[name], ("no label value reads back to the name %q"):format(name))
      end
    end)

    it("writes a UTF-8 name without a backslash as it is; else doubles backslashes and "
      .. "writes a byte that is not UTF-8 as \\xHH", function()
      local set = {}
      for _, v in ipairs(state_labels(fuse.metrics())) do set[v] = true end
      for _, name in ipairs({ "café", "日本", "\1\2\3\t\r\27\127", "a\nb", "q\"uote" }) do
        assert.is_true(set[name], ("%q is not its own label value"):format(name))
      end
      assert.is_true(set["caf\\xE9"])               -- caf\233
      assert.is_true(set["caf\\\\xE9"])             -- the name caf\xE9, spelled out
      assert.is_true(set["back\\\\slash"])
      assert.is_true(set["back\\\\slash\\xE9"])
      assert.is_true(set["\\xED\\xA0\\x80"])
      assert.is_true(set["\\xE2\\x82"])
      assert.is_true(set["spec14-\\xFF-255"])
    end)
  end)
end)
