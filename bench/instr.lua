-- bench/instr.lua -- one hot loop of bench.lua, N iterations, for an instruction count.
--
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" \
--     valgrind --tool=callgrind --callgrind-out-file=/dev/null luajit bench/instr.lua CASE N
--
-- CASE: allow+report, closed, limited, open or forced_open (the loops of bench.lua's
-- cases "b:allow() + b:report(t, true)", "fuse.wrap, closed", "fuse.wrap, closed,
-- max_concurrent = 100", "fuse.wrap, open (rejected)" and "fuse.wrap, forced_open").
-- The loop is warmed up (3,000 iterations, so it is compiled)
-- and then runs N times; it prints its sum, checked against the expected value. Run it
-- with two values of N: the difference of the two instruction totals over the difference
-- of the two N is the cost of one iteration, start-up and compilation cancelled out
-- (bench/side.lua does that).
local fuse = require "fuse"

local CASE, N = arg[1], tonumber(arg[2])
if not CASE or not N or N < 1 then
  io.stderr:write("usage: luajit bench/instr.lua allow+report|closed|limited|open|forced_open N\n")
  os.exit(2)
end

local function tiny(x) return x + 1 end
local failing = false
local function flaky(x)
  if failing then return nil, "down" end
  return x + 1
end

local loop, expected
if CASE == "allow+report" then
  local b = fuse.new { fails = 5, window = 10 }
  loop = function(n)
    local s = 0
    for _ = 1, n do
      local t = b:allow(); b:report(t, true); if t then s = s + 1 end
    end
    return s
  end
  expected = function(n) return n end
elseif CASE == "closed" or CASE == "limited" then
  local g = fuse.wrap(tiny, { fails = 5, window = 10, max_concurrent = CASE == "limited" and 100 or nil })
  loop = function(n)
    local s = 0
    for i = 1, n do s = s + g(i) end
    return s
  end
  expected = function(n) return n * (n + 1) / 2 + n end
elseif CASE == "open" or CASE == "forced_open" then
  local g, b = fuse.wrap(flaky, { fails = 5, window = 10, open_for = 86400 })
  if CASE == "open" then
    failing = true
    for _ = 1, 5 do g(0) end
    failing = false
  else
    b:force_open()
  end
  local want = CASE == "open" and "open" or "forced_open"
  assert(b:state() == want, "the breaker is " .. b:state() .. ", not " .. want)
  loop = function(n)
    local s = 0
    for i = 1, n do
      local r, rej = g(i); if r == nil and rej then s = s + 1 end
    end
    return s
  end
  expected = function(n) return n end
else
  io.stderr:write("bench/instr.lua: unknown case '" .. CASE .. "'\n")
  os.exit(2)
end

assert(loop(3000) == expected(3000), "warm-up: wrong sum")
local s = loop(N)
if s ~= expected(N) then error(("summed %.17g, expected %.17g"):format(s, expected(N))) end
print(("%.17g"):format(s))
