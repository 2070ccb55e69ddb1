// XXH3 from Debian's libxxhash (the library, not the header-only inline build).
#ifndef CXXHASH_H
#define CXXHASH_H
#include <xxhash.h>
#endif
