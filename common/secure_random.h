// Cryptographically secure randomness from the operating system (libsodium's randombytes, which
// reads getrandom(2)). For nonces, keys and, later, privacy noise; never for anything that must be
// reproducible (use common/rng.h for that).
//
// Thread-safety: all functions are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace huddle {

// `n` random bytes.
std::string SecureRandomBytes(size_t n);

// A uniformly random 64-bit value.
uint64_t SecureRandomU64();

// Initialises libsodium once (thread-safe); call before any other libsodium function. Aborts only
// when the OS has no usable entropy source, where nothing secure can run.
void EnsureSodium();

}  // namespace huddle
