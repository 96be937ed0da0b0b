// XXH3 compiled into prl rather than called in Debian's libxxhash: the library is built for
// baseline x86-64 (SSE2), while inlined here it uses the AVX2 of prl's -march (about twice the
// speed on the replay buffer's checksums). The hash values are identical either way.
#pragma once

#define XXH_INLINE_ALL
#include <xxhash.h>
