#include "CXXHash.h"
