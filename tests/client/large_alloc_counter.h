// Test helper: counts the calls of the global operator new and of aligned_alloc (the CPU backend's
// buffers) of at least a threshold of bytes in this test binary, so a test can count the
// model-sized host buffers a path allocates. The replacements live in their own translation unit
// (large_alloc_counter.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace huddle::testing_util {

struct LargeAllocations {
  int64_t count = 0;  // allocations of at least the threshold
  int64_t bytes = 0;  // their bytes
};

// Starts counting allocations of at least `threshold` bytes (all threads) from zero.
void CountAllocationsOfAtLeast(size_t threshold);
// Stops counting and returns what was counted since CountAllocationsOfAtLeast.
LargeAllocations StopCountingAllocations();

}  // namespace huddle::testing_util
