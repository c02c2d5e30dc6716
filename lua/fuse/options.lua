-- fuse.options: validation and normalization of the options of fuse.wrap/fuse.new and
-- fuse.init. Lua (LuaJIT, PUC Lua 5.1 to 5.4); both backends share it, so every
-- message comes from here. The bounds of the numeric options come from the core's
-- table (fz_config_bound), so the facade and the core never disagree on them.
--
-- check(opts, level) and check_init(opts, level) raise with error(msg, level): `level`
-- counts from the function that calls check, as error() would inside it. The facade's
-- fuse.new calls check(opts, 3) so that the error points at its caller's line. Every
-- helper below returns a message instead of raising, so only the check* functions call error.

local type, pairs, ipairs, tostring, tonumber, error, pcall, require, rawget = type, pairs,
  ipairs, tostring, tonumber, error, pcall, require, rawget
local floor, huge, abs, max, min = math.floor, math.huge, math.abs, math.max, math.min
local getmetatable = getmetatable
local fmt, byte, sort, concat = string.format, string.byte, table.sort, table.concat

local _M = {}

-- The options in the order of DESIGN.md's table; checks and messages follow it.
local NAMES = {
  "name", "fallback", "fails", "window", "count_window", "failure_rate", "min_calls",
  "slow", "slow_rate", "open_for", "backoff", "max_open_for", "jitter", "probes",
  "probe_timeout", "is_failure", "on_state_change", "max_concurrent", "max_wait",
}
_M.NAMES = NAMES
_M.INIT_NAMES = { "shared", "capacity", "idle" }

-- The numeric fields of C's fz_config, in the order diff reports them (user order).
local CFG_FIELDS = {
  "fails", "window", "count_window", "failure_rate", "min_calls", "slow", "slow_rate",
  "open_for", "backoff", "max_open_for", "jitter", "probes", "probe_timeout",
  "max_concurrent",
}
_M.CFG_FIELDS = CFG_FIELDS

-- Fields where 0 means "this rule is off" (diff prints "off" for them).
local OFF_WHEN_ZERO = {
  fails = true, count_window = true, failure_rate = true, slow = true, slow_rate = true,
  max_concurrent = true,
}

local NAME_MAX = 127                 -- FZ_NAME_MAX
local MAX_WAIT = 3600                -- seconds: max_wait's upper bound
local MAX_CAPACITY = 1000000
local MAX_IDLE = 1e9                 -- seconds: fz_registry_init's bound

-- The core's option bounds (fz_config_bound in csrc/fz.h), read through the backend
-- fuse runs on (the same choice as fuse.lua makes): the one table both check against.
local function core_bounds()
  if rawget(_G, "jit") and pcall(require, "ffi") then return require("fuse.ffi").bounds() end
  return require("fuse.core").bounds()
end

-- Number rules by option, made from the core's bounds on first use. kind "int": an
-- integer from lo to hi. kind "range": lo <= v <= hi, with lo_open / hi_open excluding
-- the bound. (zero_off is the core's: the facade passes 0 only for a rule not given.)
local NUMBERS

local function numbers()
  if NUMBERS then return NUMBERS end
  local t = {}
  for _, b in ipairs(core_bounds()) do
    t[b.name] = { kind = b.integer and "int" or "range", lo = b.lo, hi = b.hi,
      lo_open = b.lo_open, hi_open = b.hi_open }
  end
  for _, name in ipairs(CFG_FIELDS) do
    if not t[name] then error("fuse: the core has no bound for option '" .. name .. "'", 0) end
  end
  NUMBERS = t
  return t
end
_M.numbers = numbers

---------------------------------------------------------------------------------------
-- Formatting values for messages

-- A number the same way under every Lua: no "20.0" (5.4), no "-nan" (glibc), and the
-- fewest digits (14 at least) that read back as the same value, so that two different
-- values never print alike.
local math_type = rawget(math, "type")  -- (Lua 5.3 and later)

local function fmt_num(v)
  -- (an integer of 5.3+ by its digits: past 2^53 "%.17g" would round it to another value)
  if math_type and math_type(v) == "integer" then return fmt("%d", v) end
  if v ~= v then return "nan" end
  if v == huge then return "inf" end
  if v == -huge then return "-inf" end
  local s = fmt("%.14g", v)
  for digits = 15, 17 do
    if tonumber(s) == v then break end
    s = fmt("%." .. digits .. "g", v)
  end
  return s
end
_M.format_number = fmt_num

-- The length of the valid UTF-8 sequence (RFC 3629: no overlong forms, no surrogates,
-- nothing above U+10FFFF) that starts at byte i of s, or nil.
local function utf8_at(s, i)
  local c = byte(s, i)
  if c < 0x80 then return 1 end
  local n
  local lo, hi = 0x80, 0xBF
  if c >= 0xC2 and c <= 0xDF then n = 2
  elseif c >= 0xE0 and c <= 0xEF then
    n = 3
    if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F end
  elseif c >= 0xF0 and c <= 0xF4 then
    n = 4
    if c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
  else return nil end
  local c2 = byte(s, i + 1)
  if not c2 or c2 < lo or c2 > hi then return nil end
  for k = 2, n - 1 do
    local ck = byte(s, i + k)
    if not ck or ck < 0x80 or ck > 0xBF then return nil end
  end
  return n
end

-- s with each byte that is not part of a UTF-8 character written \xHH (the rest as is).
local function hex_invalid(s)
  if not s:find("[\128-\255]") then return s end
  local out, i, n = {}, 1, #s
  while i <= n do
    local len = utf8_at(s, i)
    if len then
      out[#out + 1] = s:sub(i, i + len - 1)
      i = i + len
    else
      out[#out + 1] = fmt("\\x%02X", byte(s, i))
      i = i + 1
    end
  end
  return concat(out)
end

-- Any byte string as valid UTF-8 that reads back to one string only: s itself when it
-- is UTF-8 without a backslash, as names nearly always are; otherwise s with each
-- backslash doubled and each byte that is not part of a UTF-8 character written \xHH.
-- How breaker names appear where UTF-8 is required: fuse.metrics()' `name` label, the
-- admin endpoint's JSON.
local function utf8_text(s)
  if not s:find("[\\\128-\255]") then return s end
  return hex_invalid((s:gsub("\\", "\\\\")))
end
_M.utf8_text = utf8_text

local ESCAPES = { ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t", ["\\"] = "\\\\" }

-- A string between quote marks q, as Lua would read it back (control bytes escaped,
-- bytes that are not UTF-8 as \xHH, so that the message is valid UTF-8), cut after 60
-- bytes (at the start of a character).
local function quote(s, q)
  local cut = #s > 60
  if cut then
    local j = 60
    for _ = 1, 3 do  -- not inside a character: back to its first byte (UTF-8 has 4 at most)
      local c = byte(s, j + 1)
      if c < 0x80 or c > 0xBF then break end
      j = j - 1
    end
    s = s:sub(1, j)
  end
  s = s:gsub("[%c\\" .. q .. "]", function(c)
    return ESCAPES[c] or (c == q and "\\" .. q) or fmt("\\%03d", byte(c))
  end)
  return q .. hex_invalid(s) .. (cut and "..." or "") .. q
end
_M.quote = quote  -- (fuse.upstream and the admin endpoint name unknown options and fields the same way)

-- A value as it appears after "got" in every message of fuse's: "x" for strings,
-- numbers and booleans the same under every Lua (fmt_num: "5", "nan", "inf"), the type
-- name for the rest (a table's address helps nobody).
local function show(v)
  local t = type(v)
  if t == "string" then return quote(v, '"') end
  if t == "number" then return fmt_num(v) end
  if t == "boolean" or t == "nil" then return tostring(v) end
  return t
end
_M.show = show

-- Raises "fuse: WHAT needs a function, got ..." unless fn is callable: a function, or a
-- table whose metatable has __call. `level`: as error() would take it in the function
-- that calls check_callable (fuse.wrap, fuse.watch: 2, their callers' lines).
local function check_callable(fn, what, level)
  local mt = type(fn) == "table" and getmetatable(fn)
  if type(fn) ~= "function" and not (mt and mt.__call) then
    error("fuse: " .. what .. " needs a function, got " .. show(fn), level + 1)
  end
end
_M.check_callable = check_callable

local function bad(name, what, v)
  return fmt("fuse: option '%s' must be %s, got %s", name, what, show(v))
end

---------------------------------------------------------------------------------------
-- Single options

local function check_number(name, v)
  local rule = numbers()[name]
  if rule.kind == "int" then
    if type(v) ~= "number" then return bad(name, "a positive integer", v) end
    if v ~= v or v == huge or v == -huge then return bad(name, "a finite number", v) end
    if v < rule.lo or v ~= floor(v) then return bad(name, "a positive integer", v) end
    if v > rule.hi then
      return bad(name, "an integer from " .. fmt_num(rule.lo) .. " to " .. fmt_num(rule.hi), v)
    end
    return nil
  end
  if type(v) ~= "number" then return bad(name, "a number", v) end
  if v ~= v or v == huge or v == -huge then return bad(name, "a finite number", v) end
  local lo_ok = rule.lo_open and v > rule.lo or not rule.lo_open and v >= rule.lo
  local hi_ok = rule.hi_open and v < rule.hi or not rule.hi_open and v <= rule.hi
  if lo_ok and hi_ok then return nil end
  local what
  if rule.lo_open then      -- (lo, hi]
    what = fmt("a number above %s and at most %s", fmt_num(rule.lo), fmt_num(rule.hi))
  elseif rule.hi_open then  -- [lo, hi)
    what = fmt("a number from %s to below %s", fmt_num(rule.lo), fmt_num(rule.hi))
  else                      -- [lo, hi]
    what = fmt("a number from %s to %s", fmt_num(rule.lo), fmt_num(rule.hi))
  end
  return bad(name, what, v)
end

local function check_name(v)
  if type(v) ~= "string" then return bad("name", "a string", v) end
  local what = fmt("a string of 1 to %d bytes", NAME_MAX)
  if #v == 0 then return bad("name", what, v) end
  if #v > NAME_MAX then
    return fmt("fuse: option 'name' must be %s, got %d bytes", what, #v)
  end
  local nul = v:find("\0", 1, true)  -- (where: a long name is shown cut after 60 bytes)
  if nul then return bad("name", "a string without NUL bytes", v) .. fmt(" (a NUL at byte %d)", nul) end
  return nil
end

local function check_function(name, v)
  if type(v) ~= "function" then return bad(name, "a function", v) end
  return nil
end

-- max_wait: seconds to wait for a permit, under OpenResty only (it yields with ngx.sleep).
local function check_max_wait(v)
  if type(v) ~= "number" then return bad("max_wait", "a number of seconds", v) end
  if v ~= v or v == huge or v == -huge then return bad("max_wait", "a finite number", v) end
  if v < 0 or v > MAX_WAIT then return bad("max_wait", "a number from 0 to " .. MAX_WAIT, v) end
  local ngx = rawget(_G, "ngx")
  if v > 0 and not (type(ngx) == "table" and type(ngx.sleep) == "function") then
    return fmt("fuse: option 'max_wait' needs OpenResty (it waits with ngx.sleep, yielding), got %s "
      .. "outside it; without it a call past max_concurrent is rejected at once", show(v))
  end
  return nil
end

local function check_one(name, v)
  if name == "max_wait" then return check_max_wait(v) end
  if numbers()[name] then return check_number(name, v) end
  if name == "name" then return check_name(v) end
  if name == "is_failure" or name == "on_state_change" then
    return check_function(name, v)
  end
  return nil  -- fallback: any value
end

---------------------------------------------------------------------------------------
-- Unknown keys

-- Optimal string alignment distance: insertions, deletions, substitutions and swaps of
-- two neighbours cost 1 each.
local function distance(a, b)
  local la, lb = #a, #b
  local d = {}
  for i = 0, la do d[i] = { [0] = i } end
  for j = 1, lb do d[0][j] = j end
  for i = 1, la do
    local ca = byte(a, i)
    for j = 1, lb do
      local cb = byte(b, j)
      local cost = ca == cb and 0 or 1
      local v = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
      if i > 1 and j > 1 and ca == byte(b, j - 1) and byte(a, i - 1) == cb then
        v = min(v, d[i - 2][j - 2] + 1)
      end
      d[i][j] = v
    end
  end
  return d[la][lb]
end
_M.distance = distance

-- The known name a mistyped key most likely meant, or nil. Compared case-insensitively:
-- the nearest name within distance 2 (1 for keys under 5 bytes, so that 'rate' is not
-- taken for 'name'; first in list order on a tie), else the one name that contains the
-- key (keys of 4 bytes or more, e.g. 'timeout').
local function suggest(key, known)
  local k = key:lower()
  local best, best_d = nil, #k < 5 and 2 or 3
  for _, name in ipairs(known) do
    local dist = distance(k, name)
    if dist < best_d then best, best_d = name, dist end
  end
  if best then return best end
  if #k >= 4 then
    local found
    for _, name in ipairs(known) do
      if name:find(k, 1, true) then
        if found then return nil end
        found = name
      end
    end
    return found
  end
  return nil
end
_M.suggest = suggest

-- Whether non-string key a (with value va) comes before b (vb) in messages: numbers
-- first, smallest first, then false and true, then the rest by their text. The order of
-- pairs differs between LuaJIT, Lua 5.1 and 5.4; a message must not.
local function key_before(a, va, b, vb)
  local ra = type(a) == "number" and 1 or type(a) == "boolean" and 2 or 3
  local rb = type(b) == "number" and 1 or type(b) == "boolean" and 2 or 3
  if ra ~= rb then return ra < rb end
  if ra == 1 then return a < b end
  if ra == 2 then return a == false and b == true end
  local ta, tb = show(a) .. " " .. show(va), show(b) .. " " .. show(vb)
  return ta < tb
end

-- The keys of t in the order messages name them, the same under every Lua: keys that
-- are not strings first, in key_before's order, then strings, sorted. (The first bad
-- key a message names is the first of this list that is bad; fuse.upstream orders its
-- options and peer lists by it too.)
local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  sort(keys, function(a, b)
    local sa, sb = type(a) == "string", type(b) == "string"
    if sa ~= sb then return sb end
    if sa then return a < b end
    return key_before(a, t[a], b, t[b])
  end)
  return keys
end
_M.sorted_keys = sorted_keys

-- A message for the first bad key of opts in sorted_keys' order (a key that is not a
-- string, else an unknown one), or nil. (Sorted only when a key is bad: a fuse.new of
-- good options allocates nothing here.)
local function check_keys(opts, known_set, known)
  local any = false
  for k in pairs(opts) do
    if type(k) ~= "string" or not known_set[k] then any = true; break end
  end
  if not any then return nil end
  local key
  for _, k in ipairs(sorted_keys(opts)) do
    if type(k) ~= "string" then
      return fmt("fuse: option names must be strings, got key %s (value %s)", show(k), show(opts[k]))
    end
    if not known_set[k] then key = k; break end
  end
  local near = suggest(key, known)
  if near then
    return fmt("fuse: unknown option %s (did you mean '%s'?)", quote(key, "'"), near)
  end
  return fmt("fuse: unknown option %s (options are: %s)", quote(key, "'"),
    concat(known, ", "))
end

local function set_of(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end

local KNOWN = set_of(NAMES)

---------------------------------------------------------------------------------------
-- check

-- Fills cfg from the (valid, one by one) opts o; returns a message for a rule that
-- ties two options together, or nil.
local function resolve(o, cfg)
  local cw = o.count_window or 0
  local rate_rule = o.failure_rate ~= nil or o.slow_rate ~= nil

  if o.slow_rate ~= nil and o.slow == nil then
    return "fuse: option 'slow_rate' needs option 'slow' (the seconds that make a " ..
      "call slow)"
  end
  if o.max_wait ~= nil and o.max_concurrent == nil then
    return "fuse: option 'max_wait' has no effect without 'max_concurrent'"
  end
  if o.min_calls ~= nil and not rate_rule then
    return "fuse: option 'min_calls' has no effect without 'failure_rate' or " ..
      "'slow_rate'"
  end
  if cw > 0 and o.min_calls ~= nil and o.min_calls > cw then
    return fmt("fuse: option 'min_calls' must be at most count_window (%s), got %s",
      fmt_num(cw), fmt_num(o.min_calls))
  end
  if cw > 0 and o.fails ~= nil and o.fails > cw then
    return fmt("fuse: option 'fails' must be at most count_window (%s), got %s",
      fmt_num(cw), fmt_num(o.fails))
  end

  local window = o.window or 10
  local open_for = o.open_for or window
  local backoff = o.backoff or 1
  if o.max_open_for ~= nil then
    if backoff == 1 then
      return "fuse: option 'max_open_for' has no effect unless 'backoff' is above 1"
    end
    if o.max_open_for < open_for then
      return fmt("fuse: option 'max_open_for' must be at least open_for (%s), got %s",
        fmt_num(open_for), fmt_num(o.max_open_for))
    end
  end

  -- Defaults a short count window could never reach are cut down to it. (The integer
  -- options through floor: under Lua 5.3+ a 3.0 given is the integer 3 in cfg, whose
  -- numbers show as under LuaJIT, e.g. a rejection's limit.)
  cw = floor(cw)
  local fails = floor(o.fails or (rate_rule and 0 or 5))
  local min_calls = floor(o.min_calls or 10)
  if cw > 0 then
    fails = min(fails, cw)
    min_calls = min(min_calls, cw)
  end

  cfg.window = window
  cfg.open_for = open_for
  cfg.max_open_for = o.max_open_for or open_for * 32
  cfg.slow = o.slow or 0
  cfg.probe_timeout = o.probe_timeout or window
  cfg.failure_rate = o.failure_rate or 0
  cfg.slow_rate = o.slow_rate or 0
  cfg.backoff = backoff
  cfg.jitter = o.jitter or 0
  cfg.fails = fails
  cfg.count_window = cw
  cfg.min_calls = min_calls
  cfg.probes = floor(o.probes or 1)
  cfg.max_concurrent = floor(o.max_concurrent or 0)
  return nil
end

local function validate(opts)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then
    return nil, "fuse: options must be a table, got " .. show(opts)
  end
  local msg = check_keys(opts, KNOWN, NAMES)
  if msg then return nil, msg end
  for _, name in ipairs(NAMES) do
    local v = opts[name]
    if v ~= nil then
      msg = check_one(name, v)
      if msg then return nil, msg end
    end
  end
  local cfg = {}
  msg = resolve(opts, cfg)
  if msg then return nil, msg end
  return {
    name = opts.name,
    fallback = opts.fallback,
    is_failure = opts.is_failure,
    on_state_change = opts.on_state_change,
    max_wait = opts.max_wait,
    cfg = cfg,
  }
end

-- check(opts [, level]) -> normalized options, or raises error(msg, level); level
-- defaults to 2 (the caller of check). Never a tail call to error: that would shift
-- the level under Lua 5.1.
function _M.check(opts, level)
  local r, msg = validate(opts)
  if not r then error(msg, level or 2) end
  return r
end

---------------------------------------------------------------------------------------
-- check_init

local INIT_KNOWN = set_of(_M.INIT_NAMES)

local function validate_init(opts)
  if type(opts) ~= "table" then
    return nil, "fuse: fuse.init needs a table such as { shared = true }, got " ..
      show(opts)
  end
  local msg = check_keys(opts, INIT_KNOWN, _M.INIT_NAMES)
  if msg then return nil, msg end
  if opts.shared ~= nil and type(opts.shared) ~= "boolean" then
    return nil, bad("shared", "true or false", opts.shared)
  end
  local idle = opts.idle
  if idle ~= nil then
    if type(idle) ~= "number" or idle ~= idle or idle == huge or idle == -huge then
      return nil, bad("idle", "a finite number of seconds", idle)
    end
    if idle <= 0 then return nil, bad("idle", "seconds above 0", idle) end
    if idle > MAX_IDLE then return nil, bad("idle", "at most " .. fmt_num(MAX_IDLE) .. " seconds", idle) end
  end
  local cap = opts.capacity
  if cap ~= nil then
    if type(cap) ~= "number" then return nil, bad("capacity", "a positive integer", cap) end
    if cap ~= cap or cap == huge or cap == -huge then
      return nil, bad("capacity", "a finite number", cap)
    end
    if cap < 1 or cap ~= floor(cap) then
      return nil, bad("capacity", "a positive integer", cap)
    end
    if cap > MAX_CAPACITY then
      return nil, bad("capacity", "an integer from 1 to " .. fmt_num(MAX_CAPACITY), cap)
    end
  end
  if opts.shared == nil and cap == nil and idle == nil then
    return nil, "fuse: fuse.init needs capacity, shared or idle"
  end
  return { shared = opts.shared or false, capacity = cap or (opts.shared and 1024 or 4096),
    idle = idle or 0 }
end

-- check_init(opts [, level]) -> { shared = bool, capacity = n }, or raises as check.
function _M.check_init(opts, level)
  local r, msg = validate_init(opts)
  if not r then error(msg, level or 2) end
  return r
end

---------------------------------------------------------------------------------------
-- check_admin

_M.ADMIN_NAMES = { "token" }
local ADMIN_KNOWN = set_of(_M.ADMIN_NAMES)
local TOKEN_MIN = 16

local function validate_admin(opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    return nil, 'fuse: fuse.admin needs a table such as { token = "..." } or nothing, got ' .. show(opts)
  end
  local msg = check_keys(opts, ADMIN_KNOWN, _M.ADMIN_NAMES)
  if msg then return nil, msg end
  local token = opts.token
  -- what an Authorization header carries as is: printable ASCII, no space
  if token ~= nil and (type(token) ~= "string" or #token < TOKEN_MIN or not token:find("^[!-~]+$")) then
    -- a secret, even a bad one, is not written into the error log
    local got = type(token) ~= "string" and show(token) or fmt("a string of %d bytes%s", #token,
      token:find("^[!-~]*$") and "" or " with a space or a byte outside printable ASCII")
    return nil, fmt("fuse: option 'token' must be a string of %d or more printable ASCII characters "
      .. "without spaces (openssl rand -hex 16 makes one), got %s", TOKEN_MIN, got)
  end
  return { token = token }
end

-- check_admin(opts [, level]) -> { token = string or nil } for fuse.admin(opts), or raises
-- as check.
function _M.check_admin(opts, level)
  local r, msg = validate_admin(opts)
  if not r then error(msg, level or 2) end
  return r
end

---------------------------------------------------------------------------------------
-- diff

local function same(a, b)
  if a == b then return true end
  if type(a) ~= "number" or type(b) ~= "number" then return false end
  return abs(a - b) <= 1e-9 * max(abs(a), abs(b))
end

local function show_cfg(field, v)
  if v == 0 and OFF_WHEN_ZERO[field] then return "off" end
  return show(v)
end

-- diff(a, b) -> array of "field (a vs b)" for every cfg field that differs, in
-- CFG_FIELDS order; 0 of a rule that can be off prints as "off".
function _M.diff(a, b)
  local out = {}
  for _, f in ipairs(CFG_FIELDS) do
    local va, vb = a[f], b[f]
    if not same(va, vb) then
      out[#out + 1] = fmt("%s (%s vs %s)", f, show_cfg(f, va), show_cfg(f, vb))
    end
  end
  return out
end

return _M
