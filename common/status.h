// Errors are values: every fallible call in Huddle returns absl::Status or absl::StatusOr<T>.
// No exception crosses a module boundary; exceptions thrown by third-party libraries (cppzmq,
// protobuf, yaml-cpp) are caught at the call site and turned into a Status.
#pragma once

#include <fmt/format.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace huddle {

using absl::Status;
using absl::StatusOr;

}  // namespace huddle

// Debian's abseil is built with its own absl::string_view (not std::string_view): let fmt/spdlog
// print it and absl::Status directly, e.g. spdlog::warn("{}", status).
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename Ctx>
  auto format(absl::string_view s, Ctx& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};
template <>
struct fmt::formatter<absl::Status> : fmt::formatter<std::string> {
  template <typename Ctx>
  auto format(const absl::Status& s, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(s.ToString(), ctx);
  }
};

#define HUDDLE_CONCAT_INNER_(a, b) a##b
#define HUDDLE_CONCAT_(a, b) HUDDLE_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define HUDDLE_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status huddle_status_ = (expr);          \
    if (!huddle_status_.ok()) return huddle_status_; \
  } while (0)

// `lhs = value of expr` (an absl::StatusOr<T>), or returns its error from the enclosing function.
#define HUDDLE_ASSIGN_OR_RETURN(lhs, expr) \
  HUDDLE_ASSIGN_OR_RETURN_IMPL_(HUDDLE_CONCAT_(huddle_statusor_, __LINE__), lhs, expr)
#define HUDDLE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()
