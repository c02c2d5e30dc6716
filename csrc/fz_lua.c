/*
 * fz_lua.c -- the classic C module "fuse.core" for PUC Lua 5.1 to 5.4: the one
 * Lua-aware C file of fuse.
 *
 * No logic lives here: each function checks its arguments, calls the core (fz.h) and
 * pushes the results. luaopen_fuse_core returns a table with the very functions, names,
 * arguments and results of lua/fuse/ffi.lua's module, so that the facade (lua/fuse.lua)
 * drives either backend the same way.
 *
 * A breaker handle is a full userdata holding the fz_breaker pointer. A handle made by
 * `new` owns its anonymous breaker and frees it in __gc; handles of registry breakers
 * own nothing (the registry lives as long as the process), and two handles of one
 * registry breaker may be different userdata.
 *
 * Lua 5.2+ finalizes a handle in the same cycle as the objects that still reach it
 * (their own finalizers may call through it, in any order) and lets a finalizer
 * resurrect it. So there the first __gc only marks the handle for finalization again,
 * and the breaker is freed by the second, in a later cycle in which the handle is
 * unreachable once more. During lua_close a handle cannot be marked again: the reaper,
 * a userdata in the Lua registry made before any handle (so finalized after every
 * handle), frees what is left then.
 *
 * Numbers: every result prints under Lua 5.3+ as it does under LuaJIT (tostring, `..`,
 * string.format("%s")): C doubles (tickets, seconds, rates) and integers (counts,
 * totals) alike go through push_num, so a whole number below 1e14 is a lua_Integer
 * ("10", not "10.0", for a retry_after of 10 s; "1" for a failure rate of 1) and the
 * rest a float. States and codes are lua_Integer. Integral arguments accept any number
 * with an integral value (3 or 3.0).
 */
#include "fz.h"

#include <lauxlib.h>
#include <lua.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* A new table of the functions in l. Lua 5.1: luaL_register with a NULL name fills
 * the table on top. Not LuaJIT's luaL_newlib: it calls luaL_setfuncs, which PUC Lua
 * 5.1 lacks, and build/fuse/core.so is compiled with LuaJIT's headers for both. */
#if LUA_VERSION_NUM >= 502
#define new_lib(L, l) luaL_newlib((L), (l))
#else
#define new_lib(L, l) (lua_newtable(L), luaL_register((L), NULL, (l)))
#endif

#define HANDLE_MT "fuse.core.breaker"

#define EXPORT __attribute__((visibility("default")))

EXPORT int luaopen_fuse_core(lua_State *L);

typedef struct handle {
  fz_breaker *b;
  int owned;  /* 1: an anonymous breaker that __gc frees; 2: finalized once (5.2+) */
  struct handle *prev, *next;  /* while owned == 2: in the reaper's list */
} handle;

#define REAPER_KEY "fuse.core.reaper"

/* The handles finalized once (owned == 2), whose breakers are not freed yet. */
typedef struct reaper {
  handle *first;
} reaper;

/* The fz_config field names, in fz_config order; the first NDOUBLES are doubles. */
static const char *const CFG_FIELDS[] = {
  "window", "open_for", "max_open_for", "slow", "probe_timeout", "failure_rate",
  "slow_rate", "backoff", "jitter", "fails", "count_window", "min_calls", "probes",
  "max_concurrent"
};
enum { NDOUBLES = 9, NFIELDS = 14 };

/* ---------------------------------------------------------------- numbers */

/* A C number as LuaJIT shows it. LuaJIT's numbers have no subtypes and its tostring is
 * "%.14g": under Lua 5.3+ a whole number below 1e14 in magnitude is pushed as an integer
 * (whose digits are those "%.14g" writes: "10", not 5.4's "10.0" for a float), anything
 * else as a float, which 5.3+ writes with "%.14g" as well (1e14 and above in the same
 * exponent form as LuaJIT; fractions; -0.0, NaN and the infinities). Lua 5.1 has floats
 * only. */
static void push_num(lua_State *L, double v) {
#if LUA_VERSION_NUM >= 503
  if (v > -1e14 && v < 1e14 && v == (double)(int64_t)v && !(v == 0 && signbit(v))) {
    lua_pushinteger(L, (lua_Integer)v);
    return;
  }
#endif
  lua_pushnumber(L, (lua_Number)v);
}

/* A C integer (a count, an identity, a seq): as push_num, as LuaJIT's tonumber of it. */
static void push_uint(lua_State *L, uint64_t v) { push_num(L, (double)v); }

/* Argument `arg`: a number with an integral value in [lo, hi], returned as a double
 * that the caller converts to its C type. */
static lua_Number check_int(lua_State *L, int arg, lua_Number lo, lua_Number hi) {
  lua_Number n = luaL_checknumber(L, arg);
  if (!(n >= lo && n <= hi) || n != (lua_Number)(int64_t)n)
    luaL_argerror(L, arg, lua_pushfstring(L, "integer in range expected, got %f", n));
  return n;
}

/* ---------------------------------------------------------------- handles */

static void push_handle(lua_State *L, fz_breaker *b, int owned) {
  handle *h = lua_newuserdata(L, sizeof *h);
  h->b = b;
  h->owned = owned;
  h->prev = h->next = NULL;
  luaL_getmetatable(L, HANDLE_MT);
  lua_setmetatable(L, -2);
}

/* A registry breaker as a handle, or nil for NULL. */
static void push_found(lua_State *L, fz_breaker *b) {
  if (b) push_handle(L, b, 0);
  else lua_pushnil(L);
}

static fz_breaker *check_breaker(lua_State *L, int arg) {
  handle *h = luaL_checkudata(L, arg, HANDLE_MT);
  if (!h->b) luaL_argerror(L, arg, "breaker handle already freed");
  return h->b;
}

#if LUA_VERSION_NUM >= 502
static reaper *get_reaper(lua_State *L) {
  reaper *r;
  lua_getfield(L, LUA_REGISTRYINDEX, REAPER_KEY);
  r = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return r;
}

static void unlink_handle(reaper *r, handle *h) {
  if (h->prev) h->prev->next = h->next;
  else if (r && r->first == h) r->first = h->next;
  if (h->next) h->next->prev = h->prev;
  h->prev = h->next = NULL;
}
#endif

static int handle_gc(lua_State *L) {
  handle *h = luaL_checkudata(L, 1, HANDLE_MT);
  if (!h->owned) return 0;  /* a registry breaker: nothing to free */
#if LUA_VERSION_NUM >= 502
  if (h->owned == 1) {      /* first __gc: keep the breaker, mark the handle again */
    reaper *r = get_reaper(L);
    h->owned = 2;
    if (r) {
      h->next = r->first;
      if (r->first) r->first->prev = h;
      r->first = h;
    }
    lua_getmetatable(L, 1);
    lua_setmetatable(L, 1);
    return 0;
  }
  unlink_handle(get_reaper(L), h);
#endif
  fz_breaker_free(h->b);
  h->b = NULL;
  h->owned = 0;
  return 0;
}

#if LUA_VERSION_NUM >= 502
/* lua_close: frees the breakers of the handles finalized once, which cannot be marked
 * for finalization again while the state closes. */
static int reaper_gc(lua_State *L) {
  reaper *r = lua_touserdata(L, 1);
  while (r->first) {
    handle *h = r->first;
    unlink_handle(r, h);
    fz_breaker_free(h->b);
    h->b = NULL;
    h->owned = 0;
  }
  return 0;
}

/* The reaper, once per Lua state, before any handle. */
static void make_reaper(lua_State *L) {
  reaper *r;
  lua_getfield(L, LUA_REGISTRYINDEX, REAPER_KEY);
  if (!lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return;
  }
  lua_pop(L, 1);
  r = lua_newuserdata(L, sizeof *r);
  r->first = NULL;
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, reaper_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_setfield(L, LUA_REGISTRYINDEX, REAPER_KEY);
}
#endif

/* ---------------------------------------------------------------- configs */

/* The fz_config in the table at `arg` (every field a number). */
static void check_config(lua_State *L, int arg, fz_config *c) {
  double d[NDOUBLES];
  uint32_t u[NFIELDS - NDOUBLES];
  luaL_checktype(L, arg, LUA_TTABLE);
  for (int i = 0; i < NFIELDS; i++) {
    lua_Number n;
    lua_getfield(L, arg, CFG_FIELDS[i]);
    if (lua_type(L, -1) != LUA_TNUMBER)
      luaL_argerror(L, arg, lua_pushfstring(L, "config field '%s' must be a number, got %s",
                                            CFG_FIELDS[i], luaL_typename(L, -1)));
    n = lua_tonumber(L, -1);
    lua_pop(L, 1);
    if (i < NDOUBLES) {
      d[i] = n;
    } else if (n >= 0 && n <= (lua_Number)UINT32_MAX) {
      u[i - NDOUBLES] = (uint32_t)n;
    } else {
      luaL_argerror(L, arg, lua_pushfstring(L, "config field '%s' out of range: %f",
                                            CFG_FIELDS[i], n));
    }
  }
  memset(c, 0, sizeof *c);
  c->window = d[0], c->open_for = d[1], c->max_open_for = d[2], c->slow = d[3];
  c->probe_timeout = d[4], c->failure_rate = d[5], c->slow_rate = d[6];
  c->backoff = d[7], c->jitter = d[8];
  c->fails = u[0], c->count_window = u[1], c->min_calls = u[2], c->probes = u[3];
  c->max_concurrent = u[4];
}

static void push_config(lua_State *L, const fz_config *c) {
  const double d[NDOUBLES] = { c->window, c->open_for, c->max_open_for, c->slow,
    c->probe_timeout, c->failure_rate, c->slow_rate, c->backoff, c->jitter };
  const uint32_t u[NFIELDS - NDOUBLES] = { c->fails, c->count_window, c->min_calls,
    c->probes, c->max_concurrent };
  lua_createtable(L, 0, NFIELDS);
  for (int i = 0; i < NFIELDS; i++) {
    if (i < NDOUBLES) push_num(L, d[i]);
    else push_uint(L, u[i - NDOUBLES]);
    lua_setfield(L, -2, CFG_FIELDS[i]);
  }
}

/* ---------------------------------------------------------------- the module */

static int l_strerror(lua_State *L) {
  lua_pushstring(L, fz_strerror((int)check_int(L, 1, INT32_MIN, INT32_MAX)));
  return 1;
}

/* new(cfg) -> an anonymous breaker freed with its handle, or nil, status */
static int l_new(lua_State *L) {
  fz_config c;
  int status = FZ_OK;
  fz_breaker *b;
  check_config(L, 1, &c);
  b = fz_breaker_new(&c, &status);
  if (!b) {
    lua_pushnil(L);
    lua_pushinteger(L, status);
    return 2;
  }
  push_handle(L, b, 1);
  return 1;
}

/* open(name, cfg) -> handle, status (1 created, 0 existed, FZ_EMISMATCH), identity;
 * or nil, status */
static int l_open(lua_State *L) {
  size_t len;
  const char *name = luaL_checklstring(L, 1, &len);
  fz_config c;
  int status = FZ_OK;
  uint32_t id = 0;
  check_config(L, 2, &c);
  fz_breaker *b = fz_registry_open_id(name, len, &c, &status, &id);
  push_found(L, b);
  lua_pushinteger(L, status);
  if (!b) return 2;
  push_uint(L, id);
  return 3;
}

/* find(name) -> handle, identity; or nil */
static int l_find(lua_State *L) {
  size_t len;
  const char *name = luaL_checklstring(L, 1, &len);
  uint32_t id = 0;
  fz_breaker *b = fz_registry_find_id(name, len, &id);
  push_found(L, b);
  if (!b) return 1;
  push_uint(L, id);
  return 2;
}

static int l_remove(lua_State *L) {
  size_t len;
  const char *name = luaL_checklstring(L, 1, &len);
  lua_pushboolean(L, fz_registry_remove(name, len) == 1);
  return 1;
}

static int l_id(lua_State *L) {
  push_uint(L, fz_breaker_id(check_breaker(L, 1)));
  return 1;
}

static int l_reconfigure(lua_State *L) {
  fz_breaker *b = check_breaker(L, 1);
  fz_config c;
  check_config(L, 2, &c);
  lua_pushinteger(L, fz_breaker_reconfigure(b, &c));
  return 1;
}

static int l_live(lua_State *L) {
  lua_pushinteger(L, fz_registry_live());
  return 1;
}

static int l_count(lua_State *L) {
  lua_pushinteger(L, fz_registry_count());
  return 1;
}

static int l_at(lua_State *L) {
  push_found(L, fz_registry_at((int)check_int(L, 1, INT32_MIN, INT32_MAX)));
  return 1;
}

static int l_name_of(lua_State *L) {
  lua_pushstring(L, fz_breaker_name(check_breaker(L, 1)));
  return 1;
}

/* A registry identity (fz_registry_open_id's), argument i. */
static uint32_t check_id(lua_State *L, int i) { return (uint32_t)check_int(L, i, 0, UINT32_MAX); }

static int l_config(lua_State *L) {
  fz_config c;
  fz_breaker_config(check_breaker(L, 1), &c);
  push_config(L, &c);
  return 1;
}

/* enter(h, identity) -> ticket (FZ_STALE's rejection when the identity is gone) */
static int l_enter(lua_State *L) {
  fz_breaker *b = check_breaker(L, 1);
  push_num(L, fz_enter_id(b, check_id(L, 2)));
  return 1;
}

/* enter_limit(h, identity, count_full) -> ticket, or the full rejection (a permit of
 * max_concurrent first, given back on any rejection) */
static int l_enter_limit(lua_State *L) {
  fz_breaker *b = check_breaker(L, 1);
  push_num(L, fz_enter_limit(b, check_id(L, 2), (int)check_int(L, 3, 0, 1)));
  return 1;
}

static int l_allow(lua_State *L) {
  fz_breaker *b = check_breaker(L, 1);
  push_num(L, fz_allow_id(b, check_id(L, 2)));
  return 1;
}

/* (h, ticket, outcome, elapsed) given to done, fz_done or fz_done_limit */
static int push_done(lua_State *L, int (*done)(fz_breaker *, double, int, double)) {
  fz_breaker *b = check_breaker(L, 1);
  double ticket = luaL_checknumber(L, 2);
  int outcome = (int)check_int(L, 3, INT32_MIN, INT32_MAX);
  lua_pushinteger(L, done(b, ticket, outcome, luaL_checknumber(L, 4)));
  return 1;
}

/* done(h, ticket, outcome, elapsed) -> 0, a transition code, or FZ_ETICKET */
static int l_done(lua_State *L) { return push_done(L, fz_done); }

/* done_limit(h, ticket, outcome, elapsed): the permit back, then as done */
static int l_done_limit(lua_State *L) { return push_done(L, fz_done_limit); }

static int l_state(lua_State *L) {
  lua_pushinteger(L, fz_state(check_breaker(L, 1)));
  return 1;
}

static int l_retry_after(lua_State *L) {
  push_num(L, fz_retry_after(check_breaker(L, 1)));
  return 1;
}

/* reset_id(h, id), force_open_id(h, id), disable_id(h, id) -> the transition code, or
 * FZ_ESTALE when the handle's breaker is gone */
#define L_ACT_ID(act)                                       \
  static int l_##act##_id(lua_State *L) {                   \
    fz_breaker *b = check_breaker(L, 1);                    \
    lua_pushinteger(L, fz_##act##_id(b, check_id(L, 2)));   \
    return 1;                                               \
  }
L_ACT_ID(reset)
L_ACT_ID(force_open)
L_ACT_ID(disable)

/* force_open_for_id(h, id, seconds) -> the transition code, FZ_EINVAL, or FZ_ESTALE */
static int l_force_open_for_id(lua_State *L) {
  fz_breaker *b = check_breaker(L, 1);
  uint32_t id = check_id(L, 2);
  lua_pushinteger(L, fz_force_open_for_id(b, id, luaL_checknumber(L, 3)));
  return 1;
}

/* late_id(h, id, outcome, elapsed) -> as done, or FZ_ESTALE */
static int l_late_id(lua_State *L) {
  fz_breaker *b = check_breaker(L, 1);
  uint32_t id = check_id(L, 2);
  int outcome = (int)check_int(L, 3, FZ_SUCCESS, FZ_IGNORE);
  lua_pushinteger(L, fz_late_id(b, id, outcome, luaL_checknumber(L, 4)));
  return 1;
}

static int l_events_init_shared(lua_State *L) {
  lua_pushinteger(L, fz_events_init_shared());
  return 1;
}

/* event(name, from, to) -> seq */
static int l_event(lua_State *L) {
  size_t len;
  const char *name = luaL_checklstring(L, 1, &len);
  int from = (int)check_int(L, 2, 0, 7), to = (int)check_int(L, 3, 0, 7);
  push_uint(L, (uint64_t)fz_events_add(name, len, from, to));  /* (seqs are whole numbers) */
  return 1;
}

static int l_events_last(lua_State *L) {
  push_uint(L, (uint64_t)fz_events_last());
  return 1;
}

/* event_at(seq) -> 1, seq, time, name, from, to, pid; or 0 (not complete) / -1 (lost) */
static int l_event_at(lua_State *L) {
  fz_event e;
  int rc = fz_events_read(luaL_checknumber(L, 1), &e);
  lua_pushinteger(L, rc);
  if (rc != 1) return 1;
  push_uint(L, (uint64_t)e.seq);
  push_num(L, e.time);
  lua_pushstring(L, e.name);
  lua_pushinteger(L, e.from);
  lua_pushinteger(L, e.to);
  lua_pushinteger(L, e.pid);
  return 7;
}

static void set_uint(lua_State *L, const char *field, uint64_t v) {
  push_uint(L, v);
  lua_setfield(L, 2, field);
}

static void set_number(lua_State *L, const char *field, double v) {
  push_num(L, v);
  lua_setfield(L, 2, field);
}

/* Fills the table at index 2 with the numbers of s. */
static void push_stats(lua_State *L, const fz_stats *s) {
  lua_pushinteger(L, s->state);
  lua_setfield(L, 2, "state");
  set_uint(L, "calls", s->calls);
  set_uint(L, "failures", s->failures);
  set_uint(L, "slow", s->slow);
  set_uint(L, "rejections", s->rejections);
  set_number(L, "failure_rate", s->failure_rate);
  set_number(L, "slow_rate", s->slow_rate);
  set_number(L, "retry_after", s->retry_after);
  set_uint(L, "successes_total", s->successes_total);
  set_uint(L, "failures_total", s->failures_total);
  set_uint(L, "slow_total", s->slow_total);
  set_uint(L, "rejections_total", s->rejections_total);
  set_uint(L, "opens_total", s->opens_total);
  set_uint(L, "running", s->running);
  set_uint(L, "full_total", s->full_total);
}

/* stats(h, t): fills t with the numbers of fz_stats; returns the transition code. */
static int l_stats(lua_State *L) {
  fz_breaker *b = check_breaker(L, 1);
  fz_stats s;
  luaL_checktype(L, 2, LUA_TTABLE);
  int made = fz_stats_read(b, &s);
  push_stats(L, &s);
  lua_pushinteger(L, made);
  return 1;
}

/* peek(h, t): as stats, without making any transition; returns nothing. */
static int l_peek(lua_State *L) {
  fz_breaker *b = check_breaker(L, 1);
  fz_stats s;
  luaL_checktype(L, 2, LUA_TTABLE);
  fz_stats_peek(b, &s);
  push_stats(L, &s);
  return 0;
}

/* failures(h): the failures in the window, as peek reads them (no table). */
static int l_failures(lua_State *L) {
  fz_breaker *b = check_breaker(L, 1);
  fz_stats s;
  fz_stats_peek(b, &s);
  push_uint(L, s.failures);
  return 1;
}

static int l_init_shared(lua_State *L) {
  lua_pushinteger(L, fz_registry_init_shared((uint32_t)check_int(L, 1, 0, UINT32_MAX)));
  return 1;
}

static int l_init(lua_State *L) {
  uint32_t cap = (uint32_t)check_int(L, 1, 0, UINT32_MAX);
  lua_pushinteger(L, fz_registry_init(cap, lua_toboolean(L, 2), luaL_checknumber(L, 3)));
  return 1;
}

static int l_epoch(lua_State *L) {
  lua_pushnumber(L, (lua_Number)fz_registry_epoch());
  return 1;
}

static int l_undo(lua_State *L) {
  lua_pushboolean(L, fz_registry_undo((uint64_t)luaL_checknumber(L, 1)));
  return 1;
}

static int l_idle(lua_State *L) {
  push_num(L, fz_registry_idle());
  return 1;
}

static int l_full_add(lua_State *L) {
  (void)L;
  fz_registry_full_add();
  return 0;
}

static int l_full_total(lua_State *L) {
  push_num(L, fz_registry_full_total());
  return 1;
}

static int l_evictions_total(lua_State *L) {
  push_num(L, fz_registry_evictions_total());
  return 1;
}

static int l_is_shared(lua_State *L) {
  lua_pushboolean(L, fz_registry_is_shared() != 0);
  return 1;
}

static int l_capacity(lua_State *L) {
  push_uint(L, fz_registry_capacity());
  return 1;
}

static int l_clock_manual(lua_State *L) {
  fz_clock_manual(luaL_checknumber(L, 1));
  return 0;
}

static int l_clock_auto(lua_State *L) {
  (void)L;
  fz_clock_auto();
  return 0;
}

static int l_clock_now(lua_State *L) {
  push_num(L, fz_clock_now());
  return 1;
}

/* bounds() -> { { name=, lo=, hi=, lo_open=, hi_open=, integer=, zero_off= }, ... }:
 * the core's option bounds (fz_config_bound), in fz_config order. */
static int l_bounds(lua_State *L) {
  const fz_bound *b;
  lua_newtable(L);
  for (int i = 0; (b = fz_config_bound(i)) != NULL; i++) {
    lua_createtable(L, 0, 7);
    lua_pushstring(L, b->name);
    lua_setfield(L, -2, "name");
    push_num(L, b->lo);
    lua_setfield(L, -2, "lo");
    push_num(L, b->hi);
    lua_setfield(L, -2, "hi");
    lua_pushboolean(L, b->lo_open);
    lua_setfield(L, -2, "lo_open");
    lua_pushboolean(L, b->hi_open);
    lua_setfield(L, -2, "hi_open");
    lua_pushboolean(L, b->integer);
    lua_setfield(L, -2, "integer");
    lua_pushboolean(L, b->zero_off);
    lua_setfield(L, -2, "zero_off");
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* Shared counters (fz_counters.c). */
static int l_counter_open(lua_State *L) {
  size_t len;
  const char *name = luaL_checklstring(L, 1, &len);
  lua_pushinteger(L, fz_counter_open(name, len));
  return 1;
}

static int l_counter_add(lua_State *L) {
  fz_counter_add((int)check_int(L, 1, INT32_MIN, INT32_MAX), luaL_checknumber(L, 2));
  return 0;
}

static int l_counter_value(lua_State *L) {
  push_num(L, fz_counter_value((int)check_int(L, 1, INT32_MIN, INT32_MAX)));
  return 1;
}

static int l_counter_name(lua_State *L) {
  const char *name = fz_counter_name((int)check_int(L, 1, INT32_MIN, INT32_MAX));
  if (name) lua_pushstring(L, name); else lua_pushnil(L);
  return 1;
}

/* permit_take(h, count_full) -> 1 taken, 0 full; permit_give(h): max_concurrent. */
static int l_permit_take(lua_State *L) {
  lua_pushinteger(L, fz_permit_take(check_breaker(L, 1), (int)check_int(L, 2, 0, 1)));
  return 1;
}

static int l_permit_give(lua_State *L) {
  fz_permit_give(check_breaker(L, 1));
  return 0;
}

static const luaL_Reg FUNCS[] = {
  { "strerror", l_strerror }, { "new", l_new }, { "open", l_open }, { "find", l_find },
  { "count", l_count }, { "at", l_at }, { "name_of", l_name_of }, { "config", l_config },
  { "enter", l_enter }, { "allow", l_allow }, { "done", l_done }, { "state", l_state },
  { "retry_after", l_retry_after },
  { "stats", l_stats }, { "peek", l_peek }, { "failures", l_failures }, { "init_shared", l_init_shared },
  { "is_shared", l_is_shared }, { "capacity", l_capacity },
  { "remove", l_remove }, { "id", l_id }, { "reconfigure", l_reconfigure }, { "live", l_live },
  { "init", l_init }, { "epoch", l_epoch }, { "undo", l_undo }, { "idle", l_idle }, { "full_add", l_full_add },
  { "full_total", l_full_total }, { "evictions_total", l_evictions_total },
  { "clock_manual", l_clock_manual }, { "clock_auto", l_clock_auto },
  { "clock_now", l_clock_now }, { "bounds", l_bounds },
  { "events_init_shared", l_events_init_shared }, { "event", l_event },
  { "events_last", l_events_last }, { "event_at", l_event_at }, 
  { "counter_open", l_counter_open }, { "counter_add", l_counter_add },
  { "counter_value", l_counter_value }, { "counter_name", l_counter_name },
  { "reset_id", l_reset_id }, { "force_open_id", l_force_open_id }, { "disable_id", l_disable_id },
  { "force_open_for_id", l_force_open_for_id }, { "late_id", l_late_id },
  { "permit_take", l_permit_take }, { "permit_give", l_permit_give },
  { "enter_limit", l_enter_limit }, { "done_limit", l_done_limit }, { NULL, NULL }
};

int luaopen_fuse_core(lua_State *L) {
#if LUA_VERSION_NUM >= 502
  make_reaper(L);
#endif
  if (luaL_newmetatable(L, HANDLE_MT)) {
    lua_pushcfunction(L, handle_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  new_lib(L, FUNCS);
  lua_pushliteral(L, "capi");
  lua_setfield(L, -2, "name");
  lua_pushinteger(L, FZ_COUNTERS_MAX);
  lua_setfield(L, -2, "counters_max");
  return 1;
}
