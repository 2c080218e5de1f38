#!/usr/bin/env bats
# `cmake --install` gives a user what they need to build their own program against libddp.
load '../lib/common'

teardown() { stop_store; }

@test "install tree: a program built with pkg-config links libddp and talks to a store" {
  if grep -q '^DDP_SANITIZE:STRING=.\+' "$BUILD/CMakeCache.txt"; then
    skip "a sanitized libddp cannot be loaded by an uninstrumented program (runs in the ci build)"
  fi
  prefix="$BATS_TEST_TMPDIR/prefix"
  run cmake --install "$BUILD" --prefix "$prefix"
  assert_success
  [ -x "$prefix/bin/ddprun" ]
  [ -f "$prefix/include/ddprun/ddp.h" ]
  [ -f "$prefix/share/man/man7/ddprun-store.7" ]
  libdir=$(dirname "$(find "$prefix" -name ddp.pc)")/..
  cat >"$BATS_TEST_TMPDIR/user.c" <<'C'
#include <ddp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    struct ddp_store *s;
    if (ddp_store_connect_env(5000, &s) != 0) return 1;
    if (ddp_store_set(s, "from-user", "works", 5) != 0) return 2;
    void *v; size_t n;
    if (ddp_store_get(s, "from-user", &v, &n) != 0) return 3;
    printf("%s\n", (char *)v);
    free(v);
    ddp_store_close(s);
    return 0;
}
C
  export PKG_CONFIG_PATH="$libdir/pkgconfig"
  run bash -c 'cc -o "$BATS_TEST_TMPDIR/user" "$BATS_TEST_TMPDIR/user.c" $(pkg-config --cflags --libs ddp)'
  assert_success
  start_store
  DDPRUN_STORE_ADDR="$STORE_ADDR" DDPRUN_TOKEN_FILE="$TOKFILE" LD_LIBRARY_PATH="$libdir" \
    run "$BATS_TEST_TMPDIR/user"
  assert_success
  assert_output works
}
