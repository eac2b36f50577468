// Force-included into sdk.cc alone (client/CMakeLists.txt): libhuddle_client.so is built with
// -fvisibility=hidden, and the public headers carry no export macro (they depend on the C++
// standard library alone), so their declarations get default visibility here, before anything
// else declares them. The version script sdk.map then exports just those symbols: Run, Version,
// and the vtables and type_info of Trainer and Error.
#pragma once

#pragma GCC visibility push(default)
#include "huddle/client/client.h"
#include "huddle/client/trainer.h"
#pragma GCC visibility pop
