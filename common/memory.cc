#include "common/memory.h"

#include <malloc.h>

namespace huddle {

void ReturnLargeBuffersToTheOs() {
#ifdef M_MMAP_THRESHOLD
  ::mallopt(M_MMAP_THRESHOLD, 256 * 1024);
#endif
}

}  // namespace huddle
