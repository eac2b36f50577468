#include "kernels/flush_denormals.h"

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define HUDDLE_HAVE_MXCSR 1
#endif

namespace huddle::kernels {
namespace {

#ifdef HUDDLE_HAVE_MXCSR
constexpr unsigned int kFlushToZero = 0x8000;       // MXCSR bit 15
constexpr unsigned int kDenormalsAreZero = 0x0040;  // MXCSR bit 6
#endif

}  // namespace

FlushDenormalsScope::FlushDenormalsScope() {
#ifdef HUDDLE_HAVE_MXCSR
  saved_csr_ = _mm_getcsr();
  _mm_setcsr(saved_csr_ | kFlushToZero | kDenormalsAreZero);
#endif
}

FlushDenormalsScope::~FlushDenormalsScope() {
#ifdef HUDDLE_HAVE_MXCSR
  _mm_setcsr(saved_csr_);
#endif
}

}  // namespace huddle::kernels
