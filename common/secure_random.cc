#include "common/secure_random.h"

#include <sodium.h>

#include <cstdio>
#include <cstdlib>

namespace huddle {

void EnsureSodium() {
  static const bool ok = [] {
    if (sodium_init() < 0) {
      // Only fails when the OS has no usable entropy source; nothing secure can run then.
      std::fprintf(stderr, "huddle: libsodium failed to initialise (no OS randomness)\n");
      std::abort();
    }
    return true;
  }();
  (void)ok;
}

std::string SecureRandomBytes(size_t n) {
  EnsureSodium();
  std::string out(n, '\0');
  randombytes_buf(out.data(), n);
  return out;
}

uint64_t SecureRandomU64() {
  EnsureSodium();
  uint64_t v = 0;
  randombytes_buf(&v, sizeof(v));
  return v;
}

}  // namespace huddle
