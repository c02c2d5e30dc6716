/*
 * lstates.c -- several LuaJIT states, each in its own thread, share named breakers.
 *
 * Each thread opens its own lua_State, requires "fuse" (which FFI-loads
 * build/fuse/core.so once per process) and hammers the breakers "lstates.count" and
 * "lstates.trip". A last state checks that the counts of all threads add up and that
 * failures from all states opened the shared circuit once.
 */
#include "tap.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4
#define CALLS 200000

static const char *worker_chunk =
  "local fuse = require 'fuse'\n"
  "assert(fuse._backend == 'ffi', 'backend ' .. tostring(fuse._backend))\n"
  "local b = fuse.new{ name = 'lstates.count', fails = 1000000, window = 86400 }\n"
  "local f = b:wrap(function(i) if i % 10 == 0 then return nil, 'bad' end return i end)\n"
  "for i = 1, " "200000" " do f(i) end\n"
  "local t = fuse.new{ name = 'lstates.trip', fails = 10, window = 86400, open_for = 86400 }\n"
  "for _ = 1, 3 do\n"
  "  local ok, r1, rej = pcall(t.call, t, error, 'boom')\n"
  "  assert(not ok and r1 == 'boom' or ok and r1 == nil and fuse.is_rejection(rej))\n"
  "end\n";

static const char *check_chunk =
  "local fuse = require 'fuse'\n"
  "local s = fuse.get('lstates.count'):stats()\n"
  "local t = fuse.get('lstates.trip'):stats()\n"
  "return s.successes_total, s.failures_total, t.state, t.opens_total, t.failures_total, #fuse.list()\n";

static lua_State *new_state(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  return L;
}

static void *worker(void *arg) {
  char **err = arg;
  lua_State *L = new_state();
  if (luaL_dostring(L, worker_chunk) != 0) {
    const char *m = lua_tostring(L, -1);
    *err = m ? strdup(m) : strdup("(no message)");
  }
  lua_close(L);
  return NULL;
}

int main(void) {
  pthread_t th[THREADS];
  char *errs[THREADS] = { 0 };
  for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, worker, &errs[i]);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < THREADS; i++) {
    ok(errs[i] == NULL, "Lua state %d ran without error", i + 1);
    if (errs[i]) diag("%s", errs[i]);
    free(errs[i]);
  }
  lua_State *L = new_state();
  if (luaL_dostring(L, check_chunk) != 0) {
    ok(0, "check state ran: %s", lua_tostring(L, -1));
    return done_testing();
  }
  is_int((long long)lua_tonumber(L, 1), THREADS * CALLS / 10 * 9, "successes from every state add up");
  is_int((long long)lua_tonumber(L, 2), THREADS * CALLS / 10, "failures from every state add up");
  ok(lua_tostring(L, 3) && strcmp(lua_tostring(L, 3), "open") == 0, "3 failures in each of 4 states opened the shared breaker (fails = 10)");
  is_int((long long)lua_tonumber(L, 4), 1, "it opened exactly once");
  is_int((long long)lua_tonumber(L, 5), 10, "failures after the trip were rejected, not counted");
  is_int((long long)lua_tonumber(L, 6), 2, "the process-wide registry holds the two names");
  lua_close(L);
  return done_testing();
}
