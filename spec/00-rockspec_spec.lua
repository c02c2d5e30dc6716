-- The rockspec lists every module file, under the right module name, and every C
-- source of the core: a file added to lua/ or csrc/ but forgotten here would be
-- missing from an installed rock while every test of the tree still passes.

local dir = require "pl.dir"
local path = require "pl.path"

local BACKEND = jit and "ffi" or "capi"  -- pure Lua: tagged so that every backend's run has it

-- The repository root: this file is ROOT/spec/00-rockspec_spec.lua.
local ROOT = path.dirname(path.dirname(path.abspath(debug.getinfo(1, "S").source:sub(2))))

local function read(file)
  local f = assert(io.open(path.join(ROOT, file), "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- A rockspec is Lua: run it in an empty environment and keep what it set.
local function load_rockspec(file)
  local env, chunk = {}
  if setfenv then
    chunk = assert(loadstring(read(file), "@" .. file))
    setfenv(chunk, env)
  else
    chunk = assert(load(read(file), "@" .. file, "t", env))
  end
  chunk()
  return env
end

-- Files under ROOT/sub matching the shell pattern, as paths relative to ROOT, sorted.
local function files(sub, pattern)
  local out = {}
  if path.isdir(path.join(ROOT, sub)) then
    for _, f in ipairs(dir.getallfiles(path.join(ROOT, sub), pattern)) do
      out[#out + 1] = path.relpath(f, ROOT)
    end
  end
  table.sort(out)
  return out
end

-- lua/fuse/ffi.lua -> "fuse.ffi"; lua/x/init.lua -> "x"
local function module_name(file)
  return (file:gsub("^lua/", ""):gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", "."))
end

describe("rockspec #" .. BACKEND, function()
  local specs = {}  -- the *.rockspec files at the root
  for _, f in ipairs(dir.getfiles(ROOT, "*.rockspec")) do specs[#specs + 1] = path.basename(f) end
  local file = specs[1]
  local rock, modules

  setup(function()
    rock = load_rockspec(assert(file, "no *.rockspec at the repository root"))
    modules = rock.build and rock.build.modules or {}
  end)

  it("is the only rockspec at the root and is named after its package and version", function()
    assert.equal(1, #specs, "rockspecs at the root: " .. table.concat(specs, ", "))
    assert.equal("fuse", rock.package)
    assert.equal(rock.package .. "-" .. rock.version .. ".rockspec", file)
    assert.equal("builtin", rock.build.type)
    assert.equal("MIT", rock.description.license)
  end)

  it("agrees with fuse.VERSION, the Makefile's ROCKSPEC, README's install and CHANGELOG's newest release", function()
    local version = rock.version:match("^(.-)%-%d+$")
    assert.equal(version, require("fuse").VERSION)
    assert.equal(file, read("Makefile"):match("\nROCKSPEC%s*:=%s*(%S+)"))
    local readme = read("README.md")
    assert.truthy(readme:find("build/" .. file:gsub("%.rockspec$", ".src.rock"), 1, true),
      "README's install names another rock than " .. file)
    assert.truthy(readme:find("VERSION)'   # " .. version, 1, true), "README's install prints another version")
    local newest = read("CHANGELOG.md"):match("\n## (%d+%.%d+%.%d+)")
    assert.equal(version, newest)
  end)

  it("lists every Lua file under lua/ under its module name", function()
    local lua_files = files("lua", "*.lua")
    assert.is_true(#lua_files > 0, "no Lua file under lua/")
    local unlisted = {}
    for _, f in ipairs(lua_files) do
      if modules[module_name(f)] ~= f then
        unlisted[#unlisted + 1] = module_name(f) .. " = " .. f
      end
    end
    assert.same({}, unlisted, "modules missing from the rockspec")
  end)

  it("lists only Lua files that exist, each under the name its path gives", function()
    local bad = {}
    for name, src in pairs(modules) do
      if type(src) == "string" and not path.isfile(path.join(ROOT, src)) then
        bad[#bad + 1] = name .. ": " .. src .. " does not exist"
      elseif type(src) == "string" and module_name(src) ~= name then
        bad[#bad + 1] = name .. ": " .. src .. " is module " .. module_name(src)
      end
    end
    table.sort(bad)
    assert.same({}, bad, "bad module entries in the rockspec")
  end)

  it("builds fuse.core from exactly the C files in csrc/", function()
    local core = modules["fuse.core"]
    assert.is_table(core, "fuse.core is not a C module")
    local listed, bad = {}, {}
    for _, src in ipairs(core.sources or {}) do
      listed[src] = true
      if not path.isfile(path.join(ROOT, src)) then
        bad[#bad + 1] = src .. " is listed but does not exist"
      end
    end
    local c_files = files("csrc", "*.c")
    assert.is_true(#c_files > 0, "no C file under csrc/")
    for _, f in ipairs(c_files) do
      if not listed[f] then bad[#bad + 1] = f .. " is missing from the sources" end
    end
    for _, inc in ipairs(core.incdirs or {}) do
      if not path.isdir(path.join(ROOT, inc)) then
        bad[#bad + 1] = "incdir " .. inc .. " does not exist"
      end
    end
    assert.same({}, bad, "fuse.core in the rockspec")
  end)

  it("has no C module other than fuse.core", function()
    for name, src in pairs(modules) do
      if type(src) ~= "string" then
        assert.equal("fuse.core", name)
      end
    end
  end)
end)
