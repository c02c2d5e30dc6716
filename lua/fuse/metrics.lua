-- fuse.metrics: the Prometheus text exposition of the registry's breakers (fuse.metrics())
-- and the shared counters fuse.upstream keeps (csrc/fz_counters.c); the facade
-- (lua/fuse.lua) gives fuse.metrics, fuse._counter, fuse._count, fuse._counter_value and
-- fuse._counter_metrics from here, over its backend.
local options = require "fuse.options"

local error, ipairs, type = error, ipairs, type
local concat = table.concat

local REMOVED = 5  -- FZ_REMOVED: retired, its identity not moved yet
local E_FULL = -3

local PANIC = "upstream_panic:"

-- A label value as the text format writes it (Prometheus label values must be UTF-8):
-- the name as options.utf8_text writes it, then \, \" and \n escaped.
local function label(s)
  return (options.utf8_text(s):gsub("[\\\"\n]", { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end

local METRICS = {
  { "fuse_state", "gauge", "Breaker state: 0 closed, 1 open, 2 half_open, 3 forced_open, 4 disabled.", "state_n" },
  { "fuse_window_calls", "gauge", "Calls (successes and failures) in the current window.", "calls" },
  { "fuse_window_failure_rate", "gauge", "Failures over calls in the current window.", "failure_rate" },
  { "fuse_calls_total", "counter", "Calls whose outcome was recorded.", "calls_total" },
  { "fuse_successes_total", "counter", "Calls recorded as successes.", "successes_total" },
  { "fuse_failures_total", "counter", "Calls recorded as failures.", "failures_total" },
  { "fuse_slow_calls_total", "counter", "Calls that took at least the slow threshold.", "slow_total" },
  { "fuse_rejections_total", "counter", "Calls rejected without running.", "rejections_total" },
  { "fuse_opens_total", "counter", "Times the circuit opened.", "opens_total" },
  { "fuse_running", "gauge", "Guarded calls running now (max_concurrent's permits held).", "running" },
  { "fuse_full_total", "counter", "Calls rejected because max_concurrent calls were running.", "full_total" },
}

local _M = { label = label }

-- fuse.metrics.new(B, each_breaker, sync) -> the facade's functions over the backend B:
-- each_breaker(fn) walks the registry (fn(h, name, still)); sync() brings the test
-- clock's reading to the core when one is installed.
function _M.new(B, each_breaker, sync)
  local M = {}

  ---------------------------------------------------------------------------- shared counters
  -- Internal, for fuse.upstream: counters shared by every thread and by every nginx worker
  -- forked after fuse loaded (csrc/fz_counters.c), shown by fuse.metrics().

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

  -- fuse_upstream_panic_total{pool="..."}, one row per pool; "" when there is none.
  local function counter_metrics()
    local out = {}
    for i = 0, B.counters_max - 1 do
      local name = B.counter_name(i)
      if name and name:sub(1, #PANIC) == PANIC then
        out[#out + 1] = ('fuse_upstream_panic_total{pool="%s"} %.17g\n')
          :format(label(name:sub(#PANIC + 1)), B.counter_value(i))
      end
    end
    if #out == 0 then return "" end
    return "# HELP fuse_upstream_panic_total Open peers picked because max_ejected was reached.\n"
      .. "# TYPE fuse_upstream_panic_total counter\n" .. concat(out)
  end
  M.counter_metrics = counter_metrics

  ---------------------------------------------------------------------------- metrics

  -- Prometheus text exposition of every breaker in the registry.
  function M.metrics()
    sync()
    local rows, at = {}, {}
    each_breaker(function(h, name, still)
      local s = {}
      B.peek(h, s)  -- makes no transition: those are made, and reported, by calls
      s.state_n, s.calls_total = s.state, s.successes_total + s.failures_total
      -- a name removed and made again in a later slot during the walk (another worker)
      -- is seen twice: one series per name, the later breaker's
      if still() and s.state ~= REMOVED then  -- (retired, its identity not moved yet)
        local i = at[name] or #rows + 1
        at[name], rows[i] = i, { label(name), s }
      end
    end)
    local out = {}
    for _, m in ipairs(METRICS) do
      out[#out + 1] = ("# HELP %s %s\n# TYPE %s %s\n"):format(m[1], m[3], m[1], m[2])
      for _, row in ipairs(rows) do
        out[#out + 1] = ('%s{name="%s"} %.17g\n'):format(m[1], row[1], row[2][m[4]])
      end
    end
    out[#out + 1] = ("# HELP fuse_registry_full_total Calls run unguarded: their breaker was gone "
      .. "and the registry full.\n# TYPE fuse_registry_full_total counter\n"
      .. "fuse_registry_full_total %.17g\n"):format(B.full_total())
    out[#out + 1] = ("# HELP fuse_registry_evictions_total Idle breakers evicted to make room.\n"
      .. "# TYPE fuse_registry_evictions_total counter\nfuse_registry_evictions_total %.17g\n")
      :format(B.evictions_total())
    -- fuse.upstream's counters (panic picks, failure classes), when a pool was made
    local up = package.loaded["fuse.upstream"]
    local extra = type(up) == "table" and type(up.metrics) == "function" and up.metrics() or ""
    return concat(out) .. counter_metrics() .. extra
  end

  return M
end

return _M
