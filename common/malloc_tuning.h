// Keeps large freed blocks in the heap instead of handing them back to the
// kernel, so receiving a big message reuses warm memory instead of paying a
// page fault per 4 KiB every time (many times slower than a copy into warm
// memory: docs/performance.md). Process-wide (mallopt).
#pragma once

namespace ps {
void tune_malloc_for_large_messages();
}
