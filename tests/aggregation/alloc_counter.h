// Test helper: counts calls of the global operator new in this test binary, so tests can assert
// that a hot path allocates nothing. The replacement lives in its own translation unit.
#pragma once

#include <cstdint>

namespace huddle::testing_util {

// Number of global operator new calls (all threads) since the program started.
int64_t AllocationCount();

}  // namespace huddle::testing_util
