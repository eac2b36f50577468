// Loopback port selection for local federations, tests and benchmarks.
#pragma once

#include "common/status.h"

namespace huddle::transport {

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read, released). Another
// process may take it before the caller binds it; callers on shared machines retry or accept that.
StatusOr<int> FreeLoopbackPort();

}  // namespace huddle::transport
