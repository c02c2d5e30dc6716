-- bench/stats.lua -- what the bench scripts summarize rounds with: required by bench.lua,
-- side.lua and limit.lua (each puts bench/ on package.path).
local M = {}

-- The median of a list of numbers (the list is left as it is).
function M.median(t)
  local c = {}
  for i = 1, #t do c[i] = t[i] end
  table.sort(c)
  local m = #c
  if m % 2 == 1 then return c[(m + 1) / 2] end
  return (c[m / 2] + c[m / 2 + 1]) / 2
end

-- The 1-minute load average, "?" where /proc/loadavg is missing.
function M.loadavg()
  local f = io.open("/proc/loadavg")
  if not f then return "?" end
  local l = f:read("*l") or ""
  f:close()
  return l:match("^(%S+)") or "?"
end

return M
