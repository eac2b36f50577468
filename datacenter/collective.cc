#include "datacenter/collective.h"

namespace huddle::datacenter {
namespace {

// The default preparation: nothing to arrange in advance; each run is a plain all-reduce.
template <typename T>
class PlainAllReduce final : public PreparedAllReduce {
 public:
  PlainAllReduce(Collective& collective, std::span<T> data)
      : collective_(collective), data_(data) {}
  Status Run() override { return collective_.AllReduceSum(data_); }

 private:
  Collective& collective_;
  std::span<T> data_;
};

}  // namespace

StatusOr<std::unique_ptr<PreparedAllReduce>> Collective::PrepareAllReduceSum(
    std::span<float> data) {
  return std::unique_ptr<PreparedAllReduce>(std::make_unique<PlainAllReduce<float>>(*this, data));
}

StatusOr<std::unique_ptr<PreparedAllReduce>> Collective::PrepareAllReduceSum(
    std::span<double> data) {
  return std::unique_ptr<PreparedAllReduce>(std::make_unique<PlainAllReduce<double>>(*this, data));
}

StatusOr<std::unique_ptr<PreparedAllReduce>> Collective::PrepareAllReduceSum(
    std::span<int64_t> data) {
  return std::unique_ptr<PreparedAllReduce>(std::make_unique<PlainAllReduce<int64_t>>(*this, data));
}

}  // namespace huddle::datacenter
