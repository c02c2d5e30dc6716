rockspec_format = "3.0"
package = "fuse"
version = "0.2.0-1"

source = {
  -- `luarocks make` builds from the working tree and never fetches this.
  url = ".",
}

description = {
  summary = "Circuit breakers for Lua and OpenResty, on a lock-free C core",
  detailed = [[
fuse wraps a function in a circuit breaker: after enough failures inside a window
the circuit opens and calls are rejected (or sent to a fallback) until probes show
the service has recovered. The core is C (lock-free, pthread-safe, shareable
between nginx workers); LuaJIT reaches it through the FFI, PUC Lua 5.1-5.4 through
the classic C module built from the same sources.
]],
  license = "MIT",
}

dependencies = {
  "lua >= 5.1",
}

build = {
  type = "builtin",
  modules = {
    ["fuse"] = "lua/fuse.lua",
    ["fuse.ffi"] = "lua/fuse/ffi.lua",
    ["fuse.cdef"] = "lua/fuse/cdef.lua",
    ["fuse.options"] = "lua/fuse/options.lua",
    ["fuse.admin"] = "lua/fuse/admin.lua",
    ["fuse.upstream"] = "lua/fuse/upstream.lua",
    ["fuse.pool_config"] = "lua/fuse/pool_config.lua",
    ["fuse.pool_store"] = "lua/fuse/pool_store.lua",
    ["fuse.pending"] = "lua/fuse/pending.lua",
    ["fuse.objects"] = "lua/fuse/objects.lua",
    ["fuse.events"] = "lua/fuse/events.lua",
    ["fuse.settle"] = "lua/fuse/settle.lua",
    ["fuse.metrics"] = "lua/fuse/metrics.lua",
    -- The C core. luarocks cannot pass -fvisibility=hidden: fz.h's visibility
    -- pragma marks the API for export either way.
    ["fuse.core"] = {
      sources = { "csrc/fz_state.c", "csrc/fz_clock.c", "csrc/fz_config.c", "csrc/fz_events.c", "csrc/fz_registry.c", "csrc/fz_counters.c", "csrc/fz_permits.c", "csrc/fz_lua.c" },
      incdirs = { "csrc" },
      defines = { "_GNU_SOURCE" },
      libraries = { "pthread", "m" },
    },
  },
}
