// What the lines a thread logs are about (common/logging.h's SetupLogging shows it).
#pragma once

#include <string>

namespace huddle {

// Sets what the calling thread's lines are about, e.g. "job 'mnist'": shown after the level in
// the default logger's lines ("<time> [serve] info job 'mnist': round 3/20 ..."), so that the
// lines of concurrent jobs on one console name their job. nullptr (the default) or "" adds
// nothing. The string must outlive its use: clear it before it is destroyed.
void SetThreadLogContext(const std::string* context);

}  // namespace huddle
