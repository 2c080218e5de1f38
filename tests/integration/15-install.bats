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

@test "the Debian package: ddprun, libddp, headers, pkg-config and man pages, its Depends from dpkg-shlibdeps; unpacked (not installed) it runs the default job" {
  trains # a build of its own (release, without NCCL), by the CI build's suite only
  command -v dpkg-shlibdeps >/dev/null || skip "dpkg-dev is not installed (./dev.sh deps installs it)"
  b="$BATS_TEST_TMPDIR/deb"
  run cmake -S "$REPO" -B "$b" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
    -DDDP_WITH_NCCL=OFF -DDDP_BUILD_TESTS=OFF
  assert_success
  run cmake --build "$b" -j "$(nproc)"
  assert_success
  run bash -c "cd '$b' && cpack -G DEB"
  assert_success
  cd "$BATS_TEST_TMPDIR"
  version=$(sed -n 's/^project(ddprun VERSION \([0-9.]*\).*/\1/p' "$REPO/CMakeLists.txt")
  deb="$b/ddprun_${version}_$(dpkg --print-architecture).deb"
  [ -f "$deb" ]
  dpkg-deb -c "$deb" | awk '{ print $6 }' >files
  for f in ./usr/bin/ddprun ./usr/bin/ddprun-fmnist ./usr/include/ddprun/ddp.h \
    ./usr/include/ddprun/worker/pg.h ./usr/share/man/man1/ddprun.1 ./usr/share/man/man5/ddprun-job.5 \
    ./usr/share/man/man7/ddprun-store.7 ./usr/share/man/man3/ddp_pg.3; do
    grep -qx -- "$f" files || { echo "$f is not in the package"; cat files; return 1; }
  done
  grep -qE '^\./usr/lib/[a-z0-9_-]+/libddp\.so\.0$' files
  grep -qE '^\./usr/lib/[a-z0-9_-]+/pkgconfig/ddp\.pc$' files
  # what the binaries link, as Debian's packages: libssh, libyaml, OpenSSL, OpenBLAS, zlib
  run dpkg-deb -f "$deb" Depends
  for p in libssh libyaml libssl libopenblas zlib1g libc6; do assert_output --partial "$p"; done
  refute_output --partial "nccl"
  run dpkg-deb -f "$deb" Recommends
  assert_output --partial "libcurl4"
  # unpacked into a folder, never installed: the trainer finds libddp through its RUNPATH
  root="$BATS_TEST_TMPDIR/root"
  dpkg-deb -x "$deb" "$root"
  run env -u LD_LIBRARY_PATH ldd "$root/usr/bin/ddprun-fmnist"
  assert_output --regexp "libddp\.so\.0 => $root/usr/(bin/\.\./)?lib/[a-z0-9_-]+/libddp\.so\.0"
  run env -u LD_LIBRARY_PATH "$root/usr/bin/ddprun"
  assert_success
  assert_output --partial "[localhost:0] ddprun-fmnist: 2 ranks"
  assert_output --partial "[localhost:0] epoch 3/3"
  assert_output --regexp "job default-[0-9-]+-[0-9a-f]{4} succeeded"
}
