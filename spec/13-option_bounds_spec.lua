-- The bounds of the numeric options, as README's table gives them, hold end to end: a
-- value just inside a bound makes a working breaker (anonymous and named), a value just
-- outside is the facade's error naming the option, never the core's generic error.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

-- The next double above / below x.
local function up(x)
  if x == 0 then return 2 ^ -1074 end
  local d = math.max(math.abs(x) * 2 ^ -54, 2 ^ -1074)
  while x + d == x do d = d * 2 end
  return x + d
end

local function down(x) return -up(-x) end

-- README's bounds: lo, hi, whether each is excluded, whether the option is an integer,
-- and the options it needs beside it.
local BOUNDS = {
  { "fails", 1, 1000000, int = true },
  { "window", 0.01, 86400 },
  { "count_window", 1, 1024, int = true },
  { "failure_rate", 0, 1, lo_open = true },
  { "min_calls", 1, 1000000, int = true, base = { failure_rate = 0.5 } },
  { "slow", 0, 86400, lo_open = true },
  { "slow_rate", 0, 1, lo_open = true, base = { slow = 1 } },
  { "open_for", 0.001, 86400 },
  { "backoff", 1, 100 },
  { "max_open_for", 0.001, 2764800, base = { open_for = 0.001, backoff = 2 } },
  { "jitter", 0, 1, hi_open = true },
  { "probes", 1, 16, int = true },
  { "probe_timeout", 0.001, 86400 },
}

-- Values around each bound, and whether each is inside.
local function cases(b)
  local lo, hi = b[2], b[3]
  local out = {}
  local function add(v, inside) out[#out + 1] = { v = v, inside = inside } end
  if b.int then
    add(lo, true); add(lo + 1, true); add(hi, true); add(hi - 1, true)
    add(lo - 1, false); add(down(lo), false); add(up(lo), false)
    add(hi + 1, false); add(up(hi), false); add(down(hi), false)
    return out
  end
  add(up(lo), true); add(down(hi), true)
  add(lo, not b.lo_open); add(hi, not b.hi_open)
  add(down(lo), false); add(up(hi), false)
  -- the next few doubles and a near decimal, where a second table's bound would hide
  add(up(up(lo)), true); add(down(down(hi)), true)
  if lo == 0 then add(1e-10, true); add(1e-12, true); add(1e-300, true) end
  if hi == 1 then add(0.9999999999, true) end
  return out
end

describe("fuse #" .. BACKEND, function()
  support.it_runs_on_backend()
  local uname = support.unique_names("spec13")

  describe("numeric option bounds, facade and core alike", function()
    for _, b in ipairs(BOUNDS) do
      local opt = b[1]
      for _, c in ipairs(cases(b)) do
        local shown = ("%.17g"):format(c.v)
        local what = c.inside and "makes a working breaker" or "is the facade's error naming it"
        it(opt .. " = " .. shown .. " " .. what, function()
          for _, named in ipairs({ false, true }) do
            local opts = {}
            for k, v in pairs(b.base or {}) do opts[k] = v end
            opts[opt] = c.v
            if named then opts.name = uname(opt) end
            local ok, r = pcall(fuse.new, opts)
            if c.inside then
              assert.is_true(ok, tostring(r))
              assert.equal("closed", r:state())
              assert.equal("x", r:call(function() return "x" end))
              assert.equal(1, r:stats().successes_total)
            else
              assert.is_false(ok, "accepted " .. opt .. " = " .. shown)
              assert.matches("fuse: option '" .. opt .. "' must be", tostring(r), 1, true)
            end
            assert.not_matches("cannot create", tostring(r), 1, true)
          end
        end)
      end
    end

    it("the issue's values make working breakers", function()
      for _, opts in ipairs({
        { jitter = 0.9999999999 }, { failure_rate = 1e-10 }, { slow = 1e-10 },
        { slow = 1, slow_rate = 1e-12 },
      }) do
        local ok, b = pcall(fuse.new, opts)
        assert.is_true(ok, tostring(b))
        assert.equal("closed", b:state())
      end
    end)

    it("a breaker with jitter just below 1 still opens, and then admits probes", function()
      local now = 1000
      fuse.clock(function() return now end)
      local b = fuse.new{ fails = 1, open_for = 1, jitter = down(1) }
      b:call(function() return nil, "down" end)
      local st = b:state()
      now = now + 1
      local after = b:state()
      fuse.clock()
      assert.is_true(st == "open" or st == "half_open", st)
      assert.equal("half_open", after)
    end)
  end)
end)
