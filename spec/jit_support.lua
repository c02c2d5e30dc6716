-- What the JIT specs share (LuaJIT only): trace events recorded with jit.attach, the
-- check that a loop compiled cleanly, and the check that LuaJIT blacklisted no function
-- of fuse (a blacklisted function runs interpreted for the rest of the process, and so
-- does every trace that reaches it).
--
--   local jit_support = require "spec.jit_support"
local assert = require "luassert"
local jutil = require "jit.util"
local vmdef = require "jit.vmdef"

-- the trace callback runs at odd moments: it uses no globals of the spec environment
local type, tostring, pcall, format = type, tostring, pcall, string.format

local M = {}

M.N = 20000  -- iterations of a traced loop
M.W = 20     -- warm-up runs of traced(), made with the JIT off

-- where a trace event happened, as "source:line"
local function location(func, pc)
  if type(func) ~= "function" and type(func) ~= "proto" then return "?" end
  local fi = jutil.funcinfo(func, pc)
  if fi.loc then return fi.loc end
  if fi.ffid then return vmdef.ffnames[fi.ffid] or "?" end
  if fi.addr then return ("C:%x"):format(fi.addr) end
  return "?"
end
M.location = location

-- the abort reason, as `luajit -jv` prints it
local function reason(err, info)
  if type(err) ~= "number" then return tostring(err) end
  if type(info) == "function" then info = location(info) end
  local fmt = vmdef.traceerr[err]
  if not fmt then return ("error %d (%s)"):format(err, tostring(info)) end
  local ok, s = pcall(format, fmt, info)
  return ok and s or fmt
end

-- The bytecode name at func/pc ("FORL", "FUNCF", ...); func may be a function or a proto.
local function opname(func, pc)
  local ins = jutil.funcbc(func, pc)
  if not ins then return "?" end
  local op = ins % 256
  return (vmdef.bcnames:sub(op * 6 + 1, op * 6 + 6):gsub(" +$", ""))
end
M.opname = opname

local MAX_TRACES = 12  -- a loop over one path needs a handful; more is a trace explosion

-- Runs loop(n) with trace events recorded; returns what happened. loop(n) first runs a
-- few times with the JIT off, so that the interpreter resolves the FFI symbols as any
-- program's first calls do; then traces are flushed and the hot counters reset
-- (setting hotloop resets them), so the loop starts cold and is compiled the way a
-- fresh program would compile it. Every abort counts: no function of fuse may begin a
-- trace that aborts, wherever the trace began (an entry that keeps aborting gets
-- blacklisted, and then every trace through it aborts for the rest of the process).
function M.traced(loop)
  local ev = { started = 0, stopped = 0, looped = 0, aborts = {}, traces = {} }
  local starts = {}
  local function cb(what, tr, func, pc, otr, oex)
    if what == "start" then
      ev.started = ev.started + 1
      starts[tr] = { func = func, loc = location(func, pc), root = not otr or otr == 0,
        parent = otr, exit = oex }
    elseif what == "stop" then
      ev.stopped = ev.stopped + 1
      local st, info = starts[tr] or {}, jutil.traceinfo(tr)
      local link = info and info.linktype or "?"
      if st.func == loop and st.root and link == "loop" then ev.looped = ev.looped + 1 end
      ev.traces[#ev.traces + 1] = ("trace %d %sat %s -> %s"):format(tr,
        st.root and "" or ("(%s/%s) "):format(tostring(st.parent), tostring(st.exit)),
        st.loc or "?", link)
    elseif what == "abort" then
      local st = starts[tr] or {}
      ev.aborts[#ev.aborts + 1] = ("trace %d (started at %s) aborted at %s: %s"):format(tr,
        st.loc or "?", location(func, pc), reason(otr, oex))
    end
  end
  jit.off()
  loop(M.W)
  jit.on()
  jit.flush()
  jit.opt.start("hotloop=56")
  jit.off(cb, true)  -- (as in fuse_aborts)
  jit.attach(cb, "trace")
  local ok, err = pcall(loop, M.N)
  jit.attach(cb)
  assert(ok, err)
  return ev
end

-- the loop compiled into a trace that loops back to itself, nothing aborted, and it
-- took a handful of traces
function M.assert_compiled(ev)
  local function dump()
    return ("\ntraces:\n  %s"):format(table.concat(ev.traces, "\n  "))
  end
  assert.is_true(#ev.aborts == 0, ("%d trace abort(s):\n  %s"):format(#ev.aborts,
    table.concat(ev.aborts, "\n  ")) .. dump())
  assert.is_true(ev.stopped >= 1, ("no trace was recorded (%d started)"):format(ev.started))
  assert.is_true(ev.looped >= 1, "the loop itself did not compile to a looping trace" .. dump())
  assert.is_true(ev.stopped <= MAX_TRACES, ("%d traces for one loop"):format(ev.stopped) .. dump())
end

-- Whether `source` (a chunk name such as "@/x/lua/fuse.lua") is one of fuse's files.
local function is_fuse_source(source)
  return type(source) == "string"
    and (source:find("[/\\@]fuse%.lua$") or source:find("[/\\@]fuse[/\\][%w_]+%.lua$")) ~= nil
end
M.is_fuse_source = is_fuse_source

-- Every function prototype of fuse reachable from `roots` (tables, functions): through
-- table keys, values and metatables, closures' upvalues, and each prototype's children
-- (so an inner function counts even before a closure of it exists).
function M.fuse_protos(roots)
  local seen, out = {}, {}
  local function visit(v)
    local tv = type(v)
    if (tv ~= "table" and tv ~= "function" and tv ~= "proto") or seen[v] then return end
    seen[v] = true
    if tv == "table" then
      for k, x in next, v do visit(k); visit(x) end
      visit(debug.getmetatable(v))
      return
    end
    local info = jutil.funcinfo(v)
    if not info.source then return end  -- a C function
    if tv == "function" then
      for i = 1, info.upvalues do
        local _, u = debug.getupvalue(v, i)
        visit(u)
      end
      visit(info.proto)
      return
    end
    if is_fuse_source(info.source) then out[#out + 1] = v end
    for i = 1, info.gcconsts do visit(jutil.funck(v, -i)) end
  end
  for i = 1, #roots do visit(roots[i]) end
  return out
end

local BLACKLISTED = { IFUNCF = true, IFUNCV = true, IFORL = true, IITERL = true, ILOOP = true }

-- The blacklisted entries and loops of fuse's functions, as "file:line OP@pc" strings
-- (LuaJIT patches a function's FUNCF/FUNCV, or a loop's FORL/ITERL/LOOP, into its I-
-- form once traces starting there have aborted too often), and how many functions of
-- fuse were looked at.
function M.blacklisted(roots)
  local bad, protos = {}, M.fuse_protos(roots)
  for _, p in ipairs(protos) do
    local info = jutil.funcinfo(p)
    for pc = 0, info.bytecodes - 1 do
      local op = opname(p, pc)
      if BLACKLISTED[op] then bad[#bad + 1] = ("%s %s@%d"):format(info.loc, op, pc) end
    end
  end
  return bad, #protos
end

-- The roots from which every function of fuse is reached: its modules, plus `extra`
-- (wraps and breakers, whose closures hold the per-breaker functions).
function M.fuse_roots(extra)
  local roots = {}
  for name, mod in pairs(package.loaded) do
    if name == "fuse" or name:find("^fuse%.") then roots[#roots + 1] = mod end
  end
  for i = 1, #(extra or {}) do roots[#roots + 1] = extra[i] end
  return roots
end

-- Records the aborts of traces that start in fuse's functions while fn() runs.
function M.fuse_aborts(fn)
  local aborts, starts = {}, {}
  local function cb(what, tr, func, pc, otr, oex)
    if what == "start" then
      local fi = type(func) == "function" and jutil.funcinfo(func, pc) or {}
      starts[tr] = is_fuse_source(fi.source) and location(func, pc) or nil
    elseif what == "abort" and starts[tr] then
      aborts[#aborts + 1] = ("trace started at %s aborted at %s: %s"):format(starts[tr],
        location(func, pc), reason(otr, oex))
    end
  end
  jit.off(cb, true)  -- (a handler that runs compiled code while a trace is recorded can crash LuaJIT)
  jit.attach(cb, "trace")
  local ok, err = pcall(fn)
  jit.attach(cb)
  assert(ok, err)
  return aborts
end

return M
