#include "common/malloc_tuning.h"

#include <malloc.h>

namespace ps {

void tune_malloc_for_large_messages() {
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace ps
