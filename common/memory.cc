#include "common/memory.h"

#include <malloc.h>

namespace huddle {

void ConfigureMalloc() {
#if defined(M_ARENA_MAX) && defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD)
  ::mallopt(M_ARENA_MAX, 1);
  ::mallopt(M_MMAP_THRESHOLD, 2 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
}

}  // namespace huddle
