// Checks, at compile time, that the flag SafeOutput passes is the kernel's.
#include "CFileSystemLinux.h"
#include <linux/fs.h>

_Static_assert(RENAME_NOREPLACE == 1, "RENAME_NOREPLACE");
