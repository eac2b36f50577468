// Shared test helper: temporary directories that remove themselves. Header-only; any test
// target may include it.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace huddle::testing {

// A directory under the system's temporary directory, unique to this process and object
// (huddle_<name>_<pid>_<n>), empty at construction (created unless `create` is false, for code
// that must create it itself) and removed with its contents at destruction.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(std::string_view name, bool create = true) {
    static std::atomic<int> next{0};
    path_ = (std::filesystem::temp_directory_path() /
             ("huddle_" + std::string(name) + "_" + std::to_string(::getpid()) + "_" +
              std::to_string(next++)))
                .string();
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    if (create) std::filesystem::create_directories(path_);
  }
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }
  // A path inside the directory.
  std::string operator/(std::string_view file) const {
    return (std::filesystem::path(path_) / file).string();
  }

 private:
  std::string path_;
};

// Directories made by name for one test (a fixture's member): each Make() is a fresh
// ScopedTempDir, all removed when the holder goes.
class TempDirs {
 public:
  std::string Make(std::string_view name, bool create = true) {
    return dirs_.emplace_back(std::make_unique<ScopedTempDir>(name, create))->path();
  }

 private:
  std::vector<std::unique_ptr<ScopedTempDir>> dirs_;
};

}  // namespace huddle::testing
