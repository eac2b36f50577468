// FlushDenormalsScope: treat subnormal floats as zero while training.
//
// Late in SGD many gradients and activations decay into the subnormal range, where x86 arithmetic
// takes a slow microcode path (training measured ~2x slower). Within the scope the MXCSR
// flush-to-zero (FTZ) and denormals-are-zero (DAZ) bits are set; the previous MXCSR is restored on
// destruction. Results change only for values below ~1.2e-38, which are negligible for training.
//
// On non-x86 targets the scope does nothing.
// Thread-safety: MXCSR is per-thread state, so the scope affects only the thread that creates it;
// create and destroy it on the same thread (it is neither copyable nor movable).
#pragma once

namespace huddle::kernels {

class FlushDenormalsScope {
 public:
  FlushDenormalsScope();
  ~FlushDenormalsScope();
  FlushDenormalsScope(const FlushDenormalsScope&) = delete;
  FlushDenormalsScope& operator=(const FlushDenormalsScope&) = delete;

 private:
  [[maybe_unused]] unsigned int saved_csr_ = 0;  // MXCSR on entry (x86 only)
};

}  // namespace huddle::kernels
