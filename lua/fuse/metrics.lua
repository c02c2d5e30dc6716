-- fuse.metrics: the Prometheus text exposition of the registry's breakers (fuse.metrics())
-- and the shared counters fuse.upstream keeps (csrc/fz_counters.c); the facade
-- (lua/fuse.lua) gives fuse.metrics, fuse._counter, fuse._count and fuse._counter_value
-- from here, over its backend. fuse.upstream's own series come from upstream.metrics(),
-- which fuse.metrics() appends, with its labels written by this file's label().
local options = require "fuse.options"

local error, ipairs, setmetatable, type = error, ipairs, setmetatable, type
local byte, concat, fmt = string.byte, table.concat, string.format

local REMOVED = 5  -- FZ_REMOVED: retired, its identity not moved yet
local E_FULL = -3

local LABEL_ESCAPES = { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }

-- A label value as the text format writes it (Prometheus label values must be UTF-8):
-- the name as options.utf8_text writes it, then \, \" and \n escaped. A name with none
-- of those bytes and none above 127 (nearly every name) is its own label value; a loop
-- over its bytes says so (LuaJIT compiles it; a find of a character class it does not,
-- which cost 0.6 us a name, 60 ms of a scrape of 100,000).
local function label(s)
  for i = 1, #s do
    local c = byte(s, i)
    if c > 127 or c == 34 or c == 92 or c == 10 then  -- ", \, \n
      return (options.utf8_text(s):gsub("[\\\"\n]", LABEL_ESCAPES))
    end
  end
  return s
end

-- The series of every breaker, in order: name, type, help; keep() reads their numbers.
local METRICS = {
  { "fuse_state", "gauge", "Breaker state: 0 closed, 1 open, 2 half_open, 3 forced_open, 4 disabled." },
  { "fuse_window_calls", "gauge", "Calls (successes and failures) in the current window." },
  { "fuse_window_failure_rate", "gauge", "Failures over calls in the current window." },
  { "fuse_calls_total", "counter", "Calls whose outcome was recorded." },
  { "fuse_successes_total", "counter", "Calls recorded as successes." },
  { "fuse_failures_total", "counter", "Calls recorded as failures." },
  { "fuse_slow_calls_total", "counter", "Calls that took at least the slow threshold." },
  { "fuse_rejections_total", "counter", "Calls rejected without running." },
  { "fuse_opens_total", "counter", "Times the circuit opened." },
  { "fuse_running", "gauge", "Guarded calls running now (max_concurrent's permits held)." },
  { "fuse_full_total", "counter", "Calls rejected because max_concurrent calls were running." },
}

-- The bytes of the series' names in one line of each (head and '{name=""} ').
local LINE_NAMES = 0
for _, m in ipairs(METRICS) do LINE_NAMES = LINE_NAMES + #m[1] + 10 end

-- Row i of the series' columns (cols[k] for METRICS[k]) from a stats table s of B.peek.
local function keep(cols, i, s)
  local successes, failures = s.successes_total, s.failures_total
  cols[1][i], cols[2][i], cols[3][i] = s.state, s.calls, s.failure_rate
  cols[4][i], cols[5][i], cols[6][i] = successes + failures, successes, failures
  cols[7][i], cols[8][i], cols[9][i] = s.slow_total, s.rejections_total, s.opens_total
  cols[10][i], cols[11][i] = s.running, s.full_total
end

-- A line's number is written as string.format("%.17g", v) writes it, byte for byte, and
-- cheaply in the common cases (writing a double's shortest digits is the dear part):
--   SMALL[v]   v = 0 to 1023 (states, counts in a window, most counters): the line's
--              tail '"} v\n', made once; -0 finds SMALL[0] too, so is not this case
--   "%d"       whole(v) but for 0: an integer of at most 14 digits, whose "%d" and "%.17g"
--              texts are the same digits (under Lua 5.3+ one of integer subtype only:
--              a whole float there is the case below, and past 2^53 "%.17g" rounds)
--   g17(v)     the rest (rates such as 1/3, NaN, the infinities, -0): "%.17g" itself,
--              kept per scrape by value, as a scrape meets the same rates again and again
local SMALL = {}
for v = 0, 1023 do SMALL[v] = fmt('"} %d\n', v) end

local whole
local math_type = rawget(math, "type")  -- (Lua 5.3 and later)
if math_type then
  whole = function(v) return math_type(v) == "integer" and v < 1e14 and v > -1e14 end
else
  whole = function(v) return v % 1 == 0 and v < 1e14 and v > -1e14 end
end

-- v's text string.format("%.17g", v), kept in memo by value. Not kept: NaN (never equal
-- to itself) and zero (0 and -0 are one key, "0" and "-0" two texts).
local function g17(v, memo)
  local t = memo[v]
  if t then return t end
  t = fmt("%.17g", v)
  if v == v and v ~= 0 then memo[v] = t end
  return t
end

-- new_text([size]) -> a text built by :put(...) of strings and :putf(format, ...), read
-- with :tostring(), or taken out so far with :get() (the text is empty again): LuaJIT's
-- string.buffer (room for size bytes made at once), or where there is none (Lua 5.4, a
-- LuaJIT without it) a table of the pieces that table.concat joins.
local new_text
local has_buffer, buffer = pcall(require, "string.buffer")
if has_buffer then
  new_text = buffer.new
else
  local Pieces = {}
  Pieces.__index = Pieces
  function Pieces.put(t, a, b, c, ...)  -- (a line's three pieces without a loop)
    local n = t.n + 1
    t[n] = a
    if b ~= nil then n = n + 1; t[n] = b end
    if c ~= nil then n = n + 1; t[n] = c end
    t.n = n
    if (...) ~= nil then return Pieces.put(t, ...) end
    return t
  end
  function Pieces.putf(t, f, ...) return Pieces.put(t, fmt(f, ...)) end
  function Pieces.tostring(t) return concat(t, "", 1, t.n) end
  function Pieces.get(t)  -- the text so far, taken out: t is empty again
    local text = concat(t, "", 1, t.n)
    for i = 1, t.n do t[i] = nil end
    t.n = 0
    return text
  end
  new_text = function() return setmetatable({ n = 0 }, Pieces) end
end

-- table.new(narray, nhash) where there is one (LuaJIT): the walk's tables made at their
-- size, not grown by rehashing 17 times on the way to 100,000. table.clear(t) (LuaJIT):
-- t emptied, its room kept.
local has_new, table_new = pcall(require, "table.new")
if not has_new then table_new = function() return {} end end
local has_clear, table_clear = pcall(require, "table.clear")

-- Under OpenResty, in a phase that may yield, a scrape gives the worker back every
-- YIELD_EVERY breakers it walks and every YIELD_EVERY * 8 lines it writes (about 3 ms of
-- work each: a line costs an eighth of a breaker's read) for PAUSE seconds, with
-- ngx.sleep: at 100,000 breakers a scrape is about 0.3 s of CPU, during which the
-- worker would serve nothing else. Not ngx.sleep(0): in an nginx without OpenResty's
-- delayed-events patch (Debian's, for one) it is a timer of 0 ms, which nginx runs
-- again in the same pass over its timers, before any other request's event; a 1 ms
-- timer waits for the next pass, after the worker's pending I/O (each yield adds at most
-- that to the scrape's wall time: about 60 ms at 100,000 breakers). In the other phases
-- (header_filter, log, init_worker...), outside nginx, and under a Lua without ngx, it
-- runs in one go.
local YIELD_EVERY, PAUSE = 4096, 0.001
local YIELDING = { rewrite = true, access = true, content = true, timer = true }

-- The function that yields (ngx.sleep) when the phase running now may yield, else nil.
local function yielder()
  local ngx = rawget(_G, "ngx")
  if type(ngx) ~= "table" or type(ngx.get_phase) ~= "function" or type(ngx.sleep) ~= "function" then
    return nil
  end
  if YIELDING[ngx.get_phase()] then return ngx.sleep end
  return nil
end

local _M = { label = label, YIELD_EVERY = YIELD_EVERY, PAUSE = PAUSE }

-- fuse.metrics.new(B, each_breaker, sync) -> the facade's functions over the backend B:
-- each_breaker(fn) walks the registry (fn(h, name, id): see lua/fuse.lua); sync() brings
-- the test clock's reading to the core when one is installed.
function _M.new(B, each_breaker, sync)
  local M = {}
  -- label() of the names the last scrapes showed, which the next one shows again: a
  -- lookup instead of a look at every byte (700 instructions a name, 10% of a scrape).
  -- Dropped when it holds twice the names of the last scrape and 1,024 more (names that
  -- came and went), so that it stays within a few times the registry.
  local label_of, labelled = {}, 0
  -- The walk's tables (walk_tables), kept from one scrape for the next: at 100,000
  -- breakers they are 13 MB, which a scrape made anew and wrote whole when it made them
  -- (3,100 page faults, 10 to 20 ms in the walk's first stretch between two yields) and
  -- left as garbage. Held by one scrape at a time: one that begins while another of the
  -- same worker yields makes its own.
  local spare

  ---------------------------------------------------------------------------- shared counters
  -- Internal, for fuse.upstream: counters shared by every thread and by every nginx worker
  -- forked after fuse loaded (csrc/fz_counters.c): its peer lists' change counter.

  -- fuse._counter(name) -> index for fuse._count; raises when the name is bad or the
  -- table is full.
  function M.counter(name)
    local i = B.counter_open(name)
    if i < 0 then
      error(("fuse: cannot create counter '%s': %s"):format(name,
        i == E_FULL and ("all " .. B.counters_max .. " counters are taken") or B.strerror(i)), 2)
    end
    return i
  end

  function M.count(i, n) B.counter_add(i, n or 1) end
  function M.counter_value(i) return B.counter_value(i) end

  ---------------------------------------------------------------------------- metrics

  -- write(emit): the Prometheus text exposition of every breaker in the registry. emit
  -- nil: returns it, one string. emit a function: hands it to emit in parts, in order,
  -- one at each yield of the writing (every YIELD_EVERY * 8 lines, whether it yields or
  -- not) and the rest at the end, and returns true, or nil and emit's error once emit
  -- returned nil and one (it stops there); the parts joined are the string
  -- (so the end of a scrape sends parts as it goes: joining 73 MB into one string and
  -- copying it with ngx.print were 70-130 ms in one go at 100,000 breakers).
  -- At gateway scale (100,000 breakers, 11 lines each) it is one scrape's work in the
  -- calling worker, so: one stats table for the whole walk, the numbers kept by series
  -- (cols), and each series written in one pass into one buffer, a count as its digits
  -- (see SMALL); the text is the one string.format("%s{name=\"%s\"} %.17g\n", ...) per
  -- line gave (spec 10 compares).
  --
  -- Where it may yield (see YIELD_EVERY) other requests of the worker run meanwhile, and
  -- may add and remove breakers: the walk reads each slot once, as it reads slots that
  -- other workers change under it (a slot freed before the walk reaches it is not shown,
  -- one made after the walk began may be or not, a name made again in a later slot is
  -- shown once, as its later breaker). The yield is a rare branch inside the walk's and
  -- the writing's loops, so that their traces stay whole (a loop around them, one
  -- iteration per chunk, would start traces that abort at the yield, and LuaJIT would
  -- blacklist it).
  -- walk_tables(count) -> the walk's tables with room for count breakers: at (name ->
  -- row), empty; labels (row -> label) and cols (METRICS[k]'s column: row -> number),
  -- which hold rows of a scrape before beyond the rows this one writes, never read.
  local function walk_tables(count)
    local t = spare
    if t and t.count >= count and has_clear then
      spare = nil
      table_clear(t.at)
      return t
    end
    t = { count = count, at = table_new(0, count), labels = table_new(count, 0), cols = {} }
    for k = 1, #METRICS do t.cols[k] = table_new(count, 0) end
    return t
  end

  local function write(emit)
    sync()
    local pause = yielder()
    local peek, nseries = B.peek, #METRICS
    -- (B.count(): the slots handed out, room for every breaker the walk sees)
    local tables = walk_tables(B.count())
    local s, n, at, labels, cols = {}, 0, tables.at, tables.labels, tables.cols
    local label_bytes, seen = 0, 0
    each_breaker(function(h, name, id)
      seen = seen + 1
      if seen % YIELD_EVERY == 0 and pause then pause(PAUSE) end
      peek(h, s)  -- makes no transition: those are made, and reported, by calls
      -- a name removed and made again in a later slot during the walk (another worker)
      -- is seen twice: one series per name, the later breaker's
      if B.id(h) == id and s.state ~= REMOVED then  -- (retired, its identity not moved yet)
        local i = at[name]
        if not i then
          n = n + 1
          local text = label_of[name]
          if not text then
            text, labelled = label(name), labelled + 1
            label_of[name] = text
          end
          i, at[name], labels[n], label_bytes = n, n, text, label_bytes + #text
        end
        keep(cols, i, s)
      end
    end)
    if labelled > 2 * n + 1024 then label_of, labelled = {}, 0 end
    -- (room for the text: a line's number and newline taken as 8 bytes; for parts, room
    -- made as they grow, once per scrape, as one part is taken out before the next)
    local out, memo = emit and new_text() or new_text(4096 + nseries * label_bytes
      + n * (nseries * 8 + LINE_NAMES)), {}
    -- at every YIELD_EVERY * 8 lines: the part so far to emit, then the yield; true when
    -- emit failed (returned nil and an error, as ngx.print does once the client has gone:
    -- the scrape stops there, its error kept in `failed`)
    local part, failed
    if emit then
      part = function()
        local ok, err = emit(out:get())
        if ok == nil and err ~= nil then
          failed = err
          return true
        end
        if pause then pause(PAUSE) end
      end
    elseif pause then
      part = function() pause(PAUSE) end
    end
    for k = 1, nseries do
      local m, col = METRICS[k], cols[k]
      out:put("# HELP ", m[1], " ", m[3], "\n# TYPE ", m[1], " ", m[2], "\n")
      local head, before = m[1] .. '{name="', (k - 1) * n  -- (the lines of the series before)
      for i = 1, n do  -- (the three cases: see SMALL)
        if (before + i) % (YIELD_EVERY * 8) == 0 and part and part() then
          spare = tables
          return nil, failed
        end
        local v = col[i]
        local tail = SMALL[v]
        if tail and (v ~= 0 or 1 / v > 0) then
          out:put(head, labels[i], tail)
        elseif v ~= 0 and whole(v) then
          out:put(head, labels[i]):putf('"} %d\n', v)
        else
          out:put(head, labels[i], '"} ', g17(v, memo), "\n")
        end
      end
    end
    out:put(("# HELP fuse_registry_full_total Calls run unguarded: their breaker was gone "
      .. "and the registry full.\n# TYPE fuse_registry_full_total counter\n"
      .. "fuse_registry_full_total %.17g\n"):format(B.full_total()))
    out:put(("# HELP fuse_registry_evictions_total Idle breakers evicted to make room.\n"
      .. "# TYPE fuse_registry_evictions_total counter\nfuse_registry_evictions_total %.17g\n")
      :format(B.evictions_total()))
    -- fuse.upstream's counters (panic picks, failure classes), when a pool was made
    local up = package.loaded["fuse.upstream"]
    if type(up) == "table" and type(up.metrics) == "function" then out:put(up.metrics()) end
    spare = tables
    if emit then
      local ok, err = emit(out:get())
      if ok == nil and err ~= nil then return nil, err end
      return true
    end
    return out:tostring()
  end

  -- fuse.metrics() -> the text, one string.
  function M.metrics() return (write(nil)) end

  -- fuse.metrics_chunks(fn) -> true, or nil and fn's error: the same text handed to fn in
  -- parts (the facade checks fn).
  function M.metrics_chunks(fn) return write(fn) end

  return M
end

return _M
