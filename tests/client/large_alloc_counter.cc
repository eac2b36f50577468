#include "tests/client/large_alloc_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<size_t> g_threshold{0};  // 0: not counting
std::atomic<int64_t> g_count{0};
std::atomic<int64_t> g_bytes{0};

void Count(size_t n) {
  const size_t threshold = g_threshold.load(std::memory_order_relaxed);
  if (threshold != 0 && n >= threshold) {
    g_count.fetch_add(1, std::memory_order_relaxed);
    g_bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  }
}
}  // namespace

void* operator new(size_t n) {
  Count(n);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

// The CPU backend's buffers (kernels/cpu_backend.cc) come from aligned_alloc.
extern "C" void* aligned_alloc(size_t alignment, size_t n) noexcept {
  Count(n);
  void* p = nullptr;
  return posix_memalign(&p, alignment < sizeof(void*) ? sizeof(void*) : alignment, n) == 0
             ? p
             : nullptr;
}

namespace huddle::testing_util {

void CountAllocationsOfAtLeast(size_t threshold) {
  g_count = 0;
  g_bytes = 0;
  g_threshold = threshold;
}

LargeAllocations StopCountingAllocations() {
  g_threshold = 0;
  return {g_count.load(), g_bytes.load()};
}

}  // namespace huddle::testing_util
