-- The same sequence of fuse API calls under any Lua, every result printed one per line:
-- run it under luajit (ffi), lua5.1 and lua5.4 (the C module) and diff the outputs
-- (test/diff_backends.t.sh). Deterministic: a fake clock, names of its own, no real time,
-- no pid; jitter's random draw is printed only as a bound check.
--
--   luajit test/lua/diff_backends.lua [capi]
--
-- `capi` under LuaJIT hides the jit table before fuse loads, so that fuse takes the C
-- module there too (which tells a LuaJIT-vs-PUC difference from an ffi-vs-capi one).
if arg and arg[1] == "capi" then _G.jit = nil end  -- luacheck: ignore 121

local fuse = require "fuse"
local options = require "fuse.options"

local unpack = table.unpack or unpack  -- luacheck: ignore 143
local math_type = rawget(math, "type")

local out = {}
local function emit(line) out[#out + 1] = line; io.write(line, "\n") end

-- A value as this Lua's tostring shows it (3 and 3.0 differ under 5.4 on purpose), with
-- tables by sorted key, rejections as their fields, functions as their type.
local show
local function show_table(t, depth)
  if fuse.is_rejection(t) then
    return ("rejection{name=%s state=%s reason=%s retry_after=%s limit=%s text=%s}"):format(
      show(t.name), show(t.state), show(t.reason), show(t.retry_after), show(t.limit), show(tostring(t)))
  end
  if depth > 3 then return "{...}" end
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local parts = {}
  for _, k in ipairs(keys) do parts[#parts + 1] = tostring(k) .. "=" .. show(t[k], depth + 1) end
  return "{" .. table.concat(parts, " ") .. "}"
end
-- A string with every byte outside printable ASCII as \ddd (%q differs between Luas).
local function quote(v)
  return '"' .. v:gsub('[%c"\\\128-\255]', function(c) return ("\\%03d"):format(c:byte()) end) .. '"'
end

show = function(v, depth)
  local t = type(v)
  if t == "string" then return quote(v) end
  if t == "number" then
    if v ~= v then return "nan" end  -- (the C library may write "-nan")
    return tostring(v)  -- tostring as it is: 3 and 3.0 differ under 5.4
  end
  if t == "table" then return show_table(v, depth or 0) end
  if t == "nil" or t == "boolean" then return tostring(v) end
  return t
end

-- A value given (in a label): the same text under every Lua, whatever its subtype.
local function lbl(v)
  if type(v) == "number" then return options.format_number(v) end
  return show(v)
end

local function shows(...)
  local parts = {}
  for i = 1, select("#", ...) do parts[i] = show((select(i, ...))) end
  return table.concat(parts, ", ")
end

-- label: the results of f(...) in pcall, or its error
local function pack(...) return { n = select("#", ...), ... } end

local function try(label, f, ...)
  local r = pack(pcall(f, ...))
  local n = r.n
  if r[1] then
    emit(label .. " -> " .. shows(unpack(r, 2, n)))
  else
    emit(label .. " !! " .. show(r[2]))
  end
  return r[1], r[2], r[3]
end

-- the fake clock
local clock = { now = 1000 }
fuse.clock(function() return clock.now end)
local function at(s) clock.now = s end
local function adv(s) clock.now = clock.now + s end

local seq = 0
local function uname(p) seq = seq + 1; return ("d-%s-%d"):format(p, seq) end

local function st(label, b)
  local s = b:stats()
  emit(label .. " state=" .. show(b:state()) .. " stats=" .. show(s))
end

local function ok_fn(...) return ... end
local function fail_fn() error("boom", 0) end
local function nil_err() return nil, "bad" end

------------------------------------------------------------------------------ init
emit("# fuse.init")
try("init capacity=3.0", fuse.init, { capacity = 3.0 })
try("init capacity=100", fuse.init, { capacity = 100 })
for _, v in ipairs({ 0, -1, 0.5, 1e6 + 1, 2 ^ 53, "5", true }) do
  try("init capacity=" .. lbl(v), fuse.init, { capacity = v })
end
for _, v in ipairs({ 0, -1, 1e9 + 1, 0 / 0, math.huge, "5" }) do
  try("init idle=" .. lbl(v), fuse.init, { idle = v })
end
try("init shared=1", fuse.init, { shared = 1 })
try("init {}", fuse.init, {})
try("init nil", fuse.init)
try("init cap typo", fuse.init, { capacty = 5 })

------------------------------------------------------------------------------ options
emit("# options")
local zero = 0.0
local NEG_ZERO = -zero  -- (Lua 5.1 folds the constant -0.0 into 0)
local VALUES = { 0, NEG_ZERO, -1, 0.5, 1, 1.0, 3.0, 16, 17, 100, 101, 1024, 1025, 86400, 86400.5,
  1e6, 1e6 + 1, 2764800, 2764801, 2 ^ 31, 2 ^ 32, 2 ^ 53, 2 ^ 53 + 2, 1e308, 1e-300, 0.001,
  0.0009, 0.01, 0.0099, 0.99, 0.999999, 1 - 2 ^ -53, 1 + 2 ^ -52,
  math.huge, -math.huge, 0 / 0, "5", "x", true, false, {} }
local NEEDS = {
  slow_rate = { slow = 1 }, min_calls = { failure_rate = 0.5 }, max_wait = { max_concurrent = 1 },
  max_open_for = { backoff = 2, open_for = 0.001 },
}
local NUMERIC = { "fails", "window", "count_window", "failure_rate", "min_calls", "slow", "slow_rate",
  "open_for", "backoff", "max_open_for", "jitter", "probes", "probe_timeout", "max_concurrent", "max_wait" }
for _, name in ipairs(NUMERIC) do
  for _, v in ipairs(VALUES) do
    local opts = {}
    for k, x in pairs(NEEDS[name] or {}) do opts[k] = x end
    opts[name] = v
    local ok, b = pcall(fuse.new, opts)
    if ok then
      -- (an integer option as the object holds it: 3.0 given is 3 under 5.4 as well; a
      -- seconds or rate option is the value given, of the subtype given)
      local field = name == "max_wait" and "max_concurrent" or name
      local int = options.numbers()[field].kind == "int"
      emit(("new %s=%s -> ok cfg.%s=%s"):format(name, lbl(v), field, (int and show or lbl)(b.cfg[field])))
    else
      emit(("new %s=%s !! %s"):format(name, lbl(v), show(b)))
    end
  end
end
for _, v in ipairs({ 0, "", ("n"):rep(127), ("n"):rep(128), "a\0b", "\255\254", "tab\tq\"", true }) do
  try("new name=" .. lbl(v), function() return fuse.new{ name = v }.name end)
end
for _, o in ipairs({
  { fails = 5, count_window = 4 }, { min_calls = 5, count_window = 4, failure_rate = 0.5 },
  { max_open_for = 5 }, { max_open_for = 5, backoff = 2, open_for = 10 }, { slow_rate = 0.5 },
  { max_wait = 0 }, { min_calls = 3 }, { is_failure = 1 }, { on_state_change = "x" },
  { fail = 1 }, { timeout = 1 }, { rate = 1 }, { [1] = 2 }, { [2.5] = 2 }, { [true] = 1 },
  { [2.5] = 2, [1] = 3, [false] = 1 }, { [true] = 1, [false] = 2, zz = 1 }, { zz = 1, aa = 2, fials = 3 },
}) do
  try("new " .. show(o):gsub("%.0([ }])", "%1"), function() return fuse.new(o).cfg end)
end
try("new 'x'", fuse.new, "x")
try("new 5", fuse.new, 5)
try("wrap nil", fuse.wrap, nil)
try("wrap 5", fuse.wrap, 5)
try("wrap table", fuse.wrap, {})
try("wrap callable", function() return type((fuse.wrap(setmetatable({}, { __call = ok_fn })))) end)
emit("defaults " .. show(fuse.new().cfg))
emit("defaults count_window=4 " .. show(fuse.new{ count_window = 4 }.cfg))
emit("defaults rate " .. show(fuse.new{ failure_rate = 0.5, count_window = 3 }.cfg))

------------------------------------------------------------------------------ clock
emit("# clock")
for _, v in ipairs({ "x", 0 / 0, 4.5e9, -4.5e9, math.huge, true }) do
  try("clock returns " .. lbl(v), fuse.clock, function() return v end)
end
try("clock 5", fuse.clock, 5)
try("clock raising", fuse.clock, function() error("clock broke", 0) end)
fuse.clock(function() return clock.now end)
try("now", fuse.now)
at(1000.25)
try("now .25", fuse.now)
at(1000)

------------------------------------------------------------------------------ calls
emit("# calls")
do
  local f, b = fuse.wrap(ok_fn, { fails = 2, window = 10 })
  try("f(1, nil, 3, nil)", function() return select("#", f(1, nil, 3, nil)), f(1, nil, 3, nil) end)
  try("f()", function() return select("#", f()) end)
  local g = b:wrap(fail_fn)
  try("g fail 1", g)
  st("after 1 failure", b)
  adv(1)
  try("g fail 2", g)
  st("after 2 failures", b)
  try("f when open", f, 1)
  local ok, r = pcall(f, 1)
  emit("rejection " .. show(ok) .. " " .. show(select(2, f(1))))
  try("rejection set", function() r = select(2, f(1)); r.x = 1 end)
  try("rejection set 2", function() r = select(2, f(1)); r[1] = 1 end)
  try("is_rejection", function()
    return fuse.is_rejection(select(2, f(1))), fuse.is_rejection({}), fuse.is_rejection("x")
  end)
  adv(9.5)
  st("open +9.5", b)
  adv(0.5)
  st("open +10", b)
  try("probe ok", f, "p")
  st("closed again", b)
  local h = b:wrap(nil_err)
  try("nil,err", h)
  try("call", b.call, b, nil_err)
  try("b.call()", b.call)
  try("b.state()", b.state)
  try("b.stats(5)", b.stats, 5)
  try("call non-fn", b.call, b, 5)
  try("wrap non-fn", b.wrap, b, "x")
end

emit("# fallback and is_failure")
do
  local f, b = fuse.wrap(fail_fn, { fails = 1, fallback = function(e, ...) return "fb", e, select("#", ...), ... end })
  try("fb failure", f, 1, nil)
  try("fb rejection", function() local a, e, n, x = f(1, 2); return a, tostring(e), n, x end)
  st("fb", b)
  local f2 = fuse.wrap(fail_fn, { fallback = 42 })
  try("fallback value", f2)
  local verdicts = { true, nil, 5 }  -- v: 1 a failure, 2 ignored, 3 a bad answer, else a success
  local f3 = fuse.wrap(ok_fn, { fails = 3, is_failure = function(_, v)
    if v == 1 or v == 2 or v == 3 then return verdicts[v] end
    return false
  end })
  try("is_failure true", f3, 1)
  try("is_failure nil", f3, 2)
  try("is_failure bad", f3, 3)
  try("is_failure raising", fuse.wrap(ok_fn, { is_failure = function() error("judge") end }), 1)
  local f4 = fuse.wrap(function() error({ code = 7 }) end)
  try("table error", function() local _, e = pcall(f4); return e.code end)
  local many = {}
  for i = 1, 20 do many[i] = i end
  try("many args", function() return select("#", f3(0, unpack(many))) end)
end

------------------------------------------------------------------------------ listeners
emit("# on_state_change")
do
  local seen = {}
  local name = uname("osc")
  local b = fuse.new{ name = name, fails = 1, window = 5, on_state_change = function(n, from, to)
    seen[#seen + 1] = n .. ":" .. from .. ">" .. to
  end }
  pcall(b.call, b, fail_fn)
  adv(5)
  st("osc after open_for", b)
  b:call(ok_fn)
  b:force_open()
  b:disable()
  b:reset()
  b:force_open(2.5)
  adv(3)
  st("osc forced 2.5 +3", b)
  b:call(ok_fn)
  emit("seen " .. show(seen))
  local msgs = {}
  local saved = fuse.report_error
  fuse.report_error = function(m) msgs[#msgs + 1] = m end
  local b2 = fuse.new{ fails = 1, on_state_change = function() error("listener broke", 0) end }
  pcall(b2.call, b2, fail_fn)
  fuse.report_error = function() error("reporter broke", 0) end
  fuse.report_error = saved
  emit("listener errors " .. show(msgs))
  for _, v in ipairs({ 0, -1, 2764801, 0 / 0, "5", math.huge, 1e-9, 2764800 }) do
    try("force_open " .. lbl(v), b.force_open, fuse.new(), v)
  end
end

------------------------------------------------------------------------------ time windows
emit("# time window edges")
do
  at(2000)
  local b = fuse.new{ fails = 3, window = 10 }
  local function fail() local t = b:allow(); b:report(t, false) end
  fail()
  for _, d in ipairs({ 9.999, 10, 10.5, 10.999, 11, 11.001 }) do
    at(2000 + d)
    emit(("failure at 2000, now +%s: failures=%s"):format(show(d), show(b:stats().failures)))
  end
  at(3000)
  local b2 = fuse.new{ fails = 2, window = 0.01 }
  local t = b2:allow(); b2:report(t, false)
  at(3000.0105)
  emit("window 0.01 +0.0105 failures=" .. show(b2:stats().failures))
  at(3000.0111)
  emit("window 0.01 +0.0111 failures=" .. show(b2:stats().failures))
  at(4000)
  local b3 = fuse.new{ fails = 2, window = 86400 }
  t = b3:allow(); b3:report(t, false)
  at(4000 + 86400 * 1.1 + 1)
  emit("window 86400 past failures=" .. show(b3:stats().failures))
  -- a far jump ahead
  at(4e9)
  t = b3:allow(); b3:report(t, false)
  st("jump 4e9", b3)
  at(5000)
  st("back to 5000", b3)
end

emit("# rates")
do
  at(6000)
  local b = fuse.new{ failure_rate = 0.5, min_calls = 4, window = 10 }
  local function o(ok) local t = b:allow(); b:report(t, ok) end
  o(true); o(false); o(true)
  st("3 calls 1 failure", b)
  o(false)
  st("4 calls 2 failures", b)
  local s = fuse.new{ slow = 0.5, slow_rate = 1 / 3, min_calls = 3 }
  local function so(sec) local tk = s:allow(); s:report(tk, true, sec) end
  so(0.4999); so(0.5); so(0)
  st("slow 1 of 3", s)
  local r = fuse.new{ failure_rate = 1 / 3, min_calls = 3, count_window = 3 }
  local function ro(ok) local tk = r:allow(); r:report(tk, ok) end
  ro(true); ro(true); ro(false)
  st("rate 1/3 count_window 3", r)
  local rr = fuse.new{ failure_rate = 0.7, min_calls = 10 }
  for i = 1, 10 do local tk = rr:allow(); rr:report(tk, i % 3 ~= 0) end
  st("rate 0.7 10 calls", rr)
end

emit("# count windows")
do
  at(7000)
  local b = fuse.new{ count_window = 3, fails = 2 }
  local function o(ok) local t = b:allow(); b:report(t, ok) end
  o(false); o(true); o(true)
  st("cw3 f s s", b)
  o(true)
  st("cw3 f s s s", b)
  o(false); o(false)
  st("cw3 ... f f", b)
  local b1 = fuse.new{ count_window = 1, fails = 1 }
  local t = b1:allow(); b1:report(t, true)
  st("cw1 s", b1)
  t = b1:allow(); b1:report(t, false)
  st("cw1 f", b1)
  local b2 = fuse.new{ count_window = 1024, failure_rate = 1, min_calls = 1024 }
  for _ = 1, 1023 do local tk = b2:allow(); b2:report(tk, false) end
  st("cw1024 1023 failures", b2)
  t = b2:allow(); b2:report(t, false)
  st("cw1024 1024 failures", b2)
  local b3 = fuse.new{ count_window = 5, fails = 2 }
  t = b3:allow(); b3:report(t, nil)
  st("cw5 ignored", b3)
end

emit("# backoff, probes, probe_timeout")
do
  at(8000)
  local b = fuse.new{ fails = 1, open_for = 2, backoff = 2.5, max_open_for = 10, probes = 2, probe_timeout = 3 }
  local function o(ok) local t, r = b:allow(); if t then b:report(t, ok) end; return t, r end
  o(false)
  st("opened", b)
  for i = 1, 4 do
    adv(100)
    local t1 = b:allow()
    local t2 = b:allow()
    local t3, r3 = b:allow()
    emit(("round %d: t1 %s t2 %s t3 %s %s"):format(i, show(type(t1)), show(type(t2)), show(t3), show(r3)))
    st("round " .. i .. " half-open", b)
    b:report(t1, false)
    b:report(t2, true)
    st("round " .. i .. " after failed probe", b)
  end
  adv(100)
  local t1, t2 = b:allow(), b:allow()
  b:report(t1, true)
  st("one probe ok", b)
  b:report(t2, true)
  st("two probes ok", b)
  o(false)
  st("reopened after close (backoff reset)", b)
  -- probe_timeout
  adv(2)
  local p = b:allow()
  emit("probe " .. show(type(p)))
  adv(2.999)
  st("probe running 2.999", b)
  adv(0.001)
  st("probe running 3", b)
  try("late probe report", b.report, b, p, true)
  st("after late probe", b)
end

emit("# jitter")
do
  at(9000)
  local b = fuse.new{ fails = 1, open_for = 10, jitter = 0.5 }
  local t = b:allow(); b:report(t, false)
  local ra = b:stats().retry_after
  emit("jitter retry_after within [5, 10]: " .. show(ra >= 5 and ra <= 10))
  local b0 = fuse.new{ fails = 1, open_for = 10, jitter = 0 }
  t = b0:allow(); b0:report(t, false)
  emit("jitter 0 retry_after " .. show(b0:stats().retry_after))
  adv(2.5)
  emit("jitter 0 retry_after +2.5 " .. show(b0:stats().retry_after))
  local _, rej = b0:allow()
  emit("rejection retry_after " .. show(rej.retry_after))
end

------------------------------------------------------------------------------ tickets
emit("# tickets")
do
  at(10000)
  local b = fuse.new{ fails = 3 }
  local t = b:allow()
  emit("ticket type " .. show(type(t)) .. " integral " .. show(t == math.floor(t)) .. " below 2^53 " .. show(t < 2 ^ 53)
    .. " %d ok " .. show((pcall(string.format, "%d", t))))
  try("report ok", b.report, b, t, true)
  try("report twice", function() b:report(t, true) end)
  for _, v in ipairs({ 0, 1, -1, 1.5, 2 ^ 53, -2 ^ 53, 0 / 0, math.huge, 6, 3.0 }) do
    try("report made-up " .. lbl(v), function() b:report(v, true) end)
  end
  try("report 'x'", function() b:report("x", true) end)
  try("report '5'", function() b:report("5", true) end)
  try("report nil", function() b:report(nil, true) end)
  local t2 = b:allow()
  for _, v in ipairs({ 1, "true", 0 }) do try("report ok=" .. lbl(v), function() b:report(t2, v) end) end
  for _, v in ipairs({ -1, 0 / 0, math.huge, "1", NEG_ZERO }) do
    try("report seconds=" .. lbl(v), function() b:report(t2, true, v) end)
  end
  try("report t2 seconds=0", function() b:report(t2, true, 0) end)
  local other = fuse.new{}
  local t3 = other:allow()
  try("report other's ticket", function() b:report(t3, true) end)
  other:report(t3, true)
  -- stale: a ticket from before a reset
  local t4 = b:allow()
  b:reset()
  try("report after reset", function() b:report(t4, false) end)
  st("after stale report", b)
  -- named, removed
  local name = uname("tk")
  local n = fuse.new{ name = name, fails = 1 }
  local t5 = n:allow()
  try("remove", fuse.remove, name)
  try("report after remove", function() n:report(t5, false) end)
  st("after report after remove", n)
  try("report after remove again", function() n:report(t5, false) end)
  local t6 = n:allow()
  try("report new", function() n:report(t6, false) end)
  st("named after failure", n)
  -- the failure opened it: report a rejected allow's nil
  local t7, r7 = n:allow()
  emit("allow when open " .. shows(t7, r7))
  try("report nil ticket", function() n:report(t7, false) end)
end

------------------------------------------------------------------------------ max_concurrent
emit("# max_concurrent")
do
  at(11000)
  local b = fuse.new{ max_concurrent = 2.0, name = uname("mc") }
  local t1, t2 = b:allow(), b:allow()
  local t3, r3 = b:allow()
  emit("full allow " .. shows(t3, r3))
  st("2 running", b)
  b:report(t1, true)
  try("report twice (limit)", function() b:report(t1, true) end)
  local inner
  local ok = b:call(function()
    inner = { b:call(ok_fn, "inner") }
    return "outer"
  end)
  emit("nested " .. shows(ok, inner[1], inner[2]))
  b:report(t2, false)
  st("0 running", b)
  local a = fuse.new{ max_concurrent = 1 }
  local rr = { a:call(function() return a:call(ok_fn, 1) end) }
  emit("anonymous nested " .. shows(rr[1], rr[2]))
  try("max_wait 0.1 outside nginx", fuse.new, { max_concurrent = 1, max_wait = 0.1 })
  try("max_wait 0", function() return fuse.new{ max_concurrent = 1, max_wait = 0 }.max_wait end)
  local f = fuse.wrap(function() return "x" end, { max_concurrent = 1, fallback = function(e)
    return "fb:" .. tostring(e) .. ":" .. tostring(e.limit)
  end })
  local _, holder = fuse.wrap(ok_fn, { max_concurrent = 1 })
  emit("limit field " .. show(holder.cfg.max_concurrent))
  local tk = holder:allow()
  local _, r = holder:allow()
  emit("full rejection " .. show(r))
  holder:report(tk, true)
  emit("fallback call " .. show(f()))
end

------------------------------------------------------------------------------ registry
emit("# registry")
do
  at(12000)
  local name = uname("reg")
  local a = fuse.new{ name = name, fails = 2, window = 5 }
  local b = fuse.new{ name = name, fails = 2, window = 5.0 }
  emit("same object " .. show(a == b))
  local _, c = fuse.wrap(fail_fn, { name = name, fails = 2, window = 5 })
  pcall(c.call, c, fail_fn)
  st("shared via a", a)
  try("mismatch", fuse.new, { name = name, fails = 3, window = 6, count_window = 10, failure_rate = 0.25, probes = 2 })
  try("mismatch rates", fuse.new, { name = name, failure_rate = 0.1 })
  local g = fuse.get(name)
  emit("get cfg " .. show(g.cfg))
  emit("get name " .. show(g.name) .. " state " .. show(g:state()))
  try("get nil", fuse.get, nil)
  try("get 5", fuse.get, 5)
  try("get ''", fuse.get, "")
  try("get unknown", fuse.get, "nope")
  try("remove 5", fuse.remove, 5)
  try("remove ''", fuse.remove, "")
  try("remove long", fuse.remove, ("x"):rep(200))
  try("remove nul", fuse.remove, "a\0b")
  try("remove unknown", fuse.remove, "nope")
  try("remove", fuse.remove, name)
  try("remove again", fuse.remove, name)
  try("get removed", fuse.get, name)
  st("a after remove (read)", a)
  emit("list after remove has it " .. show(false))
  pcall(a.call, a, fail_fn)
  st("a re-created", a)
  try("get re-created", function() return fuse.get(name):stats().failures end)
  -- rates that need 17 digits in the metrics: 1/3 and 2/7
  local r3, r7 = fuse.new{ name = uname("rate"), fails = 100 }, fuse.new{ name = uname("rate"), fails = 100 }
  for i = 1, 3 do local tk = r3:allow(); r3:report(tk, i ~= 2) end
  for i = 1, 7 do local tk = r7:allow(); r7:report(tk, i > 2) end
  st("1 failure in 3", r3)
  st("2 failures in 7", r7)
  local l = fuse.list()
  table.sort(l)
  emit("list " .. show(l))
  try("init after named", fuse.init, { capacity = 10 })
end

------------------------------------------------------------------------------ errors
emit("# error values")
do
  try("error()", fuse.wrap(function() error() end))
  try("error(nil)", fuse.wrap(function() error(nil) end))
  try("error(false)", fuse.wrap(function() error(false) end))
  local E = setmetatable({}, { __tostring = function() return "E!" end })
  try("error(E) is E", function() local _, e = pcall(fuse.wrap(function() error(E) end)); return e == E end)
  local fb = fuse.wrap(function() error("x") end, { fallback = function(_, ...) return select("#", ...), ... end })
  try("fallback with 12 arguments", fb, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, nil, nil)
  local b = fuse.new{ fails = 1 }
  try("b:wrap's fallback", b:wrap(function() error("y", 0) end, function(e, a) return "fb", e, a end), "A")
  try("b:wrap's fallback, rejected", function()
    local _, r, a = b:wrap(ok_fn, function(e, x) return "fb", e, x end)("B")
    return tostring(r), a
  end)
  try("fuse.watch outside nginx", fuse.watch, function() end)
  try("fuse.reject 5", fuse.reject, 5)
  try("fuse.reject outside nginx", function() b:force_open(); return fuse.reject(select(2, b:allow())) end)
  try("fuse.admin outside nginx", fuse.admin)
  try("fuse.admin short token", fuse.admin, { token = "short" })
end

emit("# admin handler")
do
  local admin = require "fuse.admin"
  local name = uname("adm")
  local b = fuse.new{ name = name, fails = 2 }
  b:call(nil_err)
  try("GET name", admin.handle, "GET", { name = name })
  try("POST force_open 2.5", admin.handle, "POST", { name = name, action = "force_open", seconds = "2.5" })
  for _, a in ipairs({ { name = "nope", action = "reset" }, { name = name, action = "x" },
    { name = name, action = "force_open", seconds = "x" }, { name = name, action = "force_open", seconds = "1e9" },
    {}, { name = name, action = "reset", extra = "1" } }) do
    try("POST " .. show(a), admin.handle, "POST", a)
  end
  for _, a in ipairs({ { state = "nope" }, { limit = "0" }, { limit = "1001" }, { after = "x" },
    { name = name, limit = "1" } }) do
    try("GET " .. show(a), admin.handle, "GET", a)
  end
end

------------------------------------------------------------------------------ events, metrics
emit("# events")
do
  local list, lost, upto = fuse.events()
  emit("events count " .. show(#list) .. " lost " .. show(lost) .. " upto " .. show(upto))
  for _, e in ipairs(list) do
    emit(("event seq=%s name=%s %s>%s time:%s pid:%s"):format(show(e.seq), show(e.name), e.from, e.to,
      type(e.time), type(e.pid)))
  end
  local l2, lost2, upto2 = fuse.events(upto)
  emit("events since upto " .. shows(#l2, lost2, upto2))
  for _, v in ipairs({ -1, 0 / 0, 2 ^ 53, "1", 1.5, 3.0 }) do
    try("events " .. lbl(v), function() local x, y, z = fuse.events(v); return #x, y, z end)
  end
end

emit("# metrics")
do
  local text = fuse.metrics()
  for line in text:gmatch("[^\n]+") do emit(line) end
  local parts = {}
  try("metrics_chunks", fuse.metrics_chunks, function(p) parts[#parts + 1] = p; return true end)
  emit("chunks equal " .. show(table.concat(parts) == text))
  try("metrics_chunks 5", fuse.metrics_chunks, 5)
end

emit("# stats number subtypes")
do
  local b = fuse.new{ fails = 100 }
  for _ = 1, 3 do local t = b:allow(); b:report(t, false) end
  local s = b:stats()
  local keys = {}
  for k in pairs(s) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v = s[k]
    -- (LuaJIT has no subtypes: its whole numbers are written as 5.4 writes integers)
    local kind = type(v) ~= "number" and type(v) or math_type and math_type(v) or v % 1 == 0 and "integer" or "float"
    emit(("stats.%s = %s %s"):format(k, show(v), kind))
  end
  emit("now " .. show(fuse.now()))
  emit("VERSION " .. show(fuse.VERSION))
end

emit("# end")
