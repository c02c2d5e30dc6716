-- docs/api.md documents every public name: each function and field of the module
-- `fuse`, each method of a breaker object, each function of `fuse.upstream` and each
-- method of a pool has a heading of its own ("### fuse.wrap", "### b:call",
-- "### upstream.new", "### pool:balance"); each option of fuse.wrap and of fuse.init,
-- each pool option and each metric family fuse.metrics() prints has a row or a mention.
-- A name added to the code and not to the reference fails here.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

local ROOT = debug.getinfo(1, "S").source:sub(2):gsub("[^/]*$", "") .. "../"

local function read(file)
  local f = assert(io.open(ROOT .. file, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local DOC = read("docs/api.md")

local headings = {}
for h in DOC:gmatch("\n### ([^\n]+)") do headings[h] = true end

-- public names of a table: keys without a leading underscore, sorted
local function public(t, want_type)
  local out = {}
  for k, v in pairs(t) do
    if type(k) == "string" and k:sub(1, 1) ~= "_" and (not want_type or type(v) == want_type) then
      out[#out + 1] = k
    end
  end
  table.sort(out)
  return out
end

local function missing_headings(prefix, names)
  local out = {}
  for _, k in ipairs(names) do
    if not headings[prefix .. k] then out[#out + 1] = prefix .. k end
  end
  return out
end

describe("docs/api.md #" .. BACKEND, function()
  support.it_runs_on_backend()

  it("has a heading for every public name of the module fuse", function()
    local names = public(fuse)
    assert.is_true(#names >= 15, "fuse exports " .. #names .. " names")
    assert.same({}, missing_headings("fuse.", names))
  end)

  it("has a heading for every method of a breaker object", function()
    local mt = getmetatable(fuse.new{})
    local names = public(mt, "function")
    assert.is_true(#names >= 9, "breaker methods: " .. table.concat(names, ", "))
    assert.same({}, missing_headings("b:", names))
  end)

  it("has a heading for every function of fuse.upstream and every method of a pool", function()
    local upstream = require "fuse.upstream"
    assert.same({}, missing_headings("upstream.", public(upstream, "function")))
    local pool = upstream.new("apidoc" .. tostring(os.time()), { "127.0.0.1:1" })
    local names = public(getmetatable(pool), "function")
    assert.is_true(#names >= 5, "pool methods: " .. table.concat(names, ", "))
    assert.same({}, missing_headings("pool:", names))
  end)

  it("has a row for every option of fuse.wrap and names every option of fuse.init", function()
    local options = require "fuse.options"
    local absent = {}
    for _, k in ipairs(options.NAMES) do
      if not DOC:find("\n| `" .. k .. "` |", 1, true) then absent[#absent + 1] = k end
    end
    local init = DOC:match("\n### fuse.init\n(.-)\n### ")
    for _, k in ipairs(options.INIT_NAMES) do
      if not init:find("`" .. k, 1, true) then absent[#absent + 1] = "init: " .. k end
    end
    assert.same({}, absent)
  end)

  it("names every pool option of upstream.new", function()
    local src = read("lua/fuse/upstream.lua")
    local keys = src:match("local POOL_NAMES = (%b{})")
    assert.is_string(keys, "lua/fuse/upstream.lua has no POOL_NAMES table")
    local new = DOC:match("\n### upstream.new\n(.-)\n### ")
    local absent = {}
    for k in keys:gmatch('"([%a_]+)"') do
      if not new:find("`" .. k .. "`", 1, true) then absent[#absent + 1] = k end
    end
    assert.same({}, absent)
  end)

  it("has a row for every metric family fuse.metrics() prints", function()
    fuse.new{ name = "apidoc-metrics", fails = 1 }
    local absent, seen = {}, 0
    for family in fuse.metrics():gmatch("# TYPE (%S+)") do
      seen = seen + 1
      if not DOC:find("| `" .. family .. "` |", 1, true) then absent[#absent + 1] = family end
    end
    assert.is_true(seen >= 9, "fuse.metrics() printed " .. seen .. " families")
    assert.same({}, absent)
  end)
end)
