#!/usr/bin/env bash
# Builds Debian 12's own Abseil (the installed version, Debian's patches) with ThreadSanitizer,
# for scripts/sanitize.sh tsan (docs/development.md, "Sanitizers").
#
# usage: scripts/tsan_deps.sh            prints the directory of the instrumented libraries
#
# Why: Debian's libabsl_synchronization is built without -fsanitize=thread, so ThreadSanitizer
# cannot see an absl::Mutex (or gRPC's mutexes, which are absl::Mutex) synchronise and reports
# every access it orders as a race. The libraries built here have Debian's sonames and ABI
# (Debian's configure patch: the `debian3` inline namespace, absl's own optional/string_view),
# so with LD_LIBRARY_PATH pointing at them the TSan binaries and Debian's gRPC both load the
# instrumented Abseil. The source is the Debian archive's, checked against the .dsc's SHA-256.
# The build is cached in build-tsan-deps/ and redone only when this script's pins change.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=20220623.1
DEBIAN_REVISION=1+deb12u2
ORIG_SHA256=abfe2897f3a30edaa74bc34365afe3c2a3cd012091a97dc7e008f7016adcd5fe
DEBIAN_SHA256=e08490fc7b6f3beca1925953b0c4fb92df2de5e2a01295e4641e2a3d4e528eeb
POOL=${PRL_DEBIAN_POOL:-http://deb.debian.org/debian/pool/main/a/abseil}
ROOT=$PWD/build-tsan-deps
STAMP="abseil $VERSION-$DEBIAN_REVISION -fsanitize=thread -O2 -g"
LIB=$ROOT/abseil/lib

installed=$(dpkg-query -W -f='${Version}' libabsl20220623 2>/dev/null || true)
if [[ "$installed" != "$VERSION-$DEBIAN_REVISION" ]]; then
  echo "tsan_deps: the pins are Abseil $VERSION-$DEBIAN_REVISION but libabsl20220623 is" \
    "'${installed:-not installed}'; update VERSION, DEBIAN_REVISION and the SHA-256s" >&2
  exit 1
fi
if [[ -f $ROOT/abseil/stamp && "$(cat "$ROOT/abseil/stamp")" == "$STAMP" ]]; then
  echo "$LIB"
  exit 0
fi

rm -rf "$ROOT/abseil"
mkdir -p "$ROOT/abseil/download"
cd "$ROOT/abseil/download"
fetch() {  # fetch FILE SHA256
  curl -sfSL --retry 3 -o "$1" "$POOL/$1"
  echo "$2  $1" | sha256sum -c --quiet - >&2
}
fetch "abseil_$VERSION.orig.tar.gz" "$ORIG_SHA256"
fetch "abseil_$VERSION-$DEBIAN_REVISION.debian.tar.xz" "$DEBIAN_SHA256"
mkdir -p ../src
tar -xzf "abseil_$VERSION.orig.tar.gz" -C ../src --strip-components=1
tar -xJf "abseil_$VERSION-$DEBIAN_REVISION.debian.tar.xz" -C ../src
cd ../src
while read -r patch; do
  [[ -z "$patch" || "$patch" == \#* ]] && continue
  patch -p1 --quiet <"debian/patches/$patch"
done <debian/patches/series

# Debian's rules: C++17, shared libraries (the static ones are not loaded by anything here).
FLAGS="-fsanitize=thread -fno-omit-frame-pointer"
cmake -S . -B ../build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_STANDARD=17 \
  -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF -DABSL_ENABLE_INSTALL=ON \
  -DCMAKE_INSTALL_PREFIX="$ROOT/abseil" -DCMAKE_INSTALL_LIBDIR=lib \
  -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_C_FLAGS="$FLAGS" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" >&2
cmake --build ../build -j "$(nproc)" >&2
cmake --install ../build >&2
rm -rf ../build ../src ../download "$ROOT/abseil/include"
echo "$STAMP" >"$ROOT/abseil/stamp"
echo "$LIB"
