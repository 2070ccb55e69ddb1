// XXH3 from Debian's libxxhash (the library, not the header-only inline build). Used only
// through FastHash's Swift types.
#ifndef CXXHASH_H
#define CXXHASH_H
#include <xxhash.h>
#endif
