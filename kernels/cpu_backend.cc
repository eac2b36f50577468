// The CPU backend: host memory, and every kernel run at once by its CPU reference
// (kernels/<op>_cpu.cc). Copies are memcpy; nothing is ever pending, so waits are no-ops.
#include <absl/strings/str_cat.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/activation.h"
#include "kernels/backend.h"
#include "kernels/dropout.h"
#include "kernels/group_norm.h"
#include "kernels/loss.h"

namespace huddle::kernels {
namespace {

class CpuBackend final : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "cpu"; }

  StatusOr<DeviceBuffer> Allocate(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("allocate ", bytes, " bytes"));
    if (bytes == 0) return DeviceBuffer();
    const auto rounded = static_cast<size_t>((bytes + kAlignment - 1) / kAlignment * kAlignment);
    void* data = std::aligned_alloc(kAlignment, rounded);
    if (data == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu: cannot allocate ", bytes, " bytes of host memory"));
    }
    return DeviceBuffer(this, data, bytes);
  }
  void Free(void* data) override { std::free(data); }
  void CopyToDevice(void* dst, const void* src, int64_t bytes) override { Copy(dst, src, bytes); }
  Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    Copy(dst, src, bytes);
    return absl::OkStatus();
  }
  void CopyOnDevice(void* dst, const void* src, int64_t bytes) override { Copy(dst, src, bytes); }
  void Zero(void* dst, int64_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, static_cast<size_t>(bytes));
  }
  Status Synchronize() override { return absl::OkStatus(); }

  void DenseForward(const DenseShape& shape, const float* x, const float* w, const float* bias,
                    float* y) override {
    kernels::DenseForward(shape, x, w, bias, y);
  }
  void DenseBackward(const DenseShape& shape, const float* x, const float* w, const float* dy,
                     float* dw, float* dbias, float* dx) override {
    kernels::DenseBackward(shape, x, w, dy, dw, dbias, dx);
  }
  void ReluForward(float* y, int64_t n) override { kernels::ReluForward(y, n); }
  void ReluBackward(const float* y, float* dy, int64_t n) override {
    kernels::ReluBackward(y, dy, n);
  }
  void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch,
                           int64_t classes, float* dlogits, LossAccumulator* totals) override {
    const LossTotals t = kernels::SoftmaxCrossEntropy(logits, labels, batch, classes, dlogits);
    totals->loss_sum += t.loss_sum;
    totals->correct += t.correct;
  }
  void SgdStep(const SgdHyper& hyper, const float* grad, float* param, float* velocity,
               int64_t n) override {
    kernels::SgdStep(hyper, grad, param, velocity, n);
  }
  void GatherRows(const float* features, const int32_t* labels, int64_t cols, const int64_t* rows,
                  int64_t count, float* x, int32_t* y) override {
    kernels::GatherRows(features, labels, cols, rows, count, x, y);
  }
  void BatchNormSums(const float* x, int64_t batch, int64_t features, int64_t spatial,
                     double* sums) override {
    kernels::BatchNormSums(x, batch, features, spatial, sums);
  }
  void BatchNormMoments(const double* sums, int64_t count, int64_t features, double eps,
                        float* mean, float* invstd) override {
    kernels::BatchNormMoments(sums, count, features, eps, mean, invstd);
  }
  void BatchNormUpdateRunning(const double* sums, int64_t count, int64_t features, double momentum,
                              float* running_mean, float* running_var) override {
    kernels::BatchNormUpdateRunning(sums, count, features, momentum, running_mean, running_var);
  }
  void BatchNormInvStd(const float* var, int64_t features, double eps, float* invstd) override {
    kernels::BatchNormInvStd(var, features, eps, invstd);
  }
  void BatchNormForward(const float* x, int64_t batch, int64_t features, int64_t spatial,
                        const float* mean, const float* invstd, const float* gamma,
                        const float* beta, float* y) override {
    kernels::BatchNormForward(x, batch, features, spatial, mean, invstd, gamma, beta, y);
  }
  void BatchNormBackwardSums(const float* dy, const float* x, const float* mean,
                             const float* invstd, int64_t batch, int64_t features, int64_t spatial,
                             double* sums) override {
    kernels::BatchNormBackwardSums(dy, x, mean, invstd, batch, features, spatial, sums);
  }
  void BatchNormParamGrads(const double* sums, int64_t features, float* dgamma,
                           float* dbeta) override {
    kernels::BatchNormParamGrads(sums, features, dgamma, dbeta);
  }
  void BatchNormBackwardInput(const float* dy, const float* x, const float* mean,
                              const float* invstd, const float* gamma, const double* sums,
                              int64_t count, int64_t batch, int64_t features, int64_t spatial,
                              float* dx) override {
    kernels::BatchNormBackwardInput(dy, x, mean, invstd, gamma, sums, count, batch, features,
                                    spatial, dx);
  }
  // ---- Convolution and pooling (kernels/conv.h, kernels/pool.h) ----
  void Conv2dForward(const Conv2dShape& s, const float* x, const float* w, const float* bias,
                     float* y, float* scratch) override {
    kernels::Conv2dForward(s, x, w, bias, y, scratch);
  }
  void Conv2dBackward(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                      float* dw, float* dbias, float* dx, float* scratch) override {
    kernels::Conv2dBackward(s, x, w, dy, dw, dbias, dx, scratch);
  }
  void AddConv2dSquaredNorms(const Conv2dShape& s, const float* x, const float* dy,
                             double* squared_norms, float* scratch) override {
    kernels::AddConv2dSquaredNorms(s, x, dy, squared_norms, scratch);
  }
  void MaxPool2dForward(const Pool2dShape& s, const float* x, float* y, int32_t* argmax) override {
    kernels::MaxPool2dForward(s, x, y, argmax);
  }
  void MaxPool2dBackward(const Pool2dShape& s, const float* dy, const int32_t* argmax,
                         float* dx) override {
    kernels::MaxPool2dBackward(s, dy, argmax, dx);
  }
  void AvgPool2dForward(const Pool2dShape& s, const float* x, float* y) override {
    kernels::AvgPool2dForward(s, x, y);
  }
  void AvgPool2dBackward(const Pool2dShape& s, const float* dy, float* dx) override {
    kernels::AvgPool2dBackward(s, dy, dx);
  }
  // ---- end convolution and pooling ----
  // ---- Normalisation, activations, dropout (kernels/group_norm.h, activation.h, dropout.h) ----
  void GroupNormForward(const GroupNormShape& s, const float* x, const float* gamma,
                        const float* beta, double eps, float* y, float* mean,
                        float* invstd) override {
    kernels::GroupNormForward(s, x, gamma, beta, eps, y, mean, invstd);
  }
  void GroupNormBackward(const GroupNormShape& s, const float* x, const float* dy,
                         const float* gamma, const float* mean, const float* invstd, float* dgamma,
                         float* dbeta, float* dx) override {
    kernels::GroupNormBackward(s, x, dy, gamma, mean, invstd, dgamma, dbeta, dx);
  }
  void AddGroupNormSquaredNorms(const GroupNormShape& s, const float* x, const float* dy,
                                const float* mean, const float* invstd,
                                double* squared_norms) override {
    kernels::AddGroupNormSquaredNorms(s, x, dy, mean, invstd, squared_norms);
  }
  void TanhForward(float* y, int64_t n) override { kernels::TanhForward(y, n); }
  void TanhBackward(const float* y, float* dy, int64_t n) override {
    kernels::TanhBackward(y, dy, n);
  }
  void DropoutForward(float* x, int64_t n, float p, uint64_t seed, uint64_t offset) override {
    kernels::DropoutForward(x, n, p, seed, offset);
  }
  void DropoutBackward(float* dy, int64_t n, float p, uint64_t seed, uint64_t offset) override {
    kernels::DropoutBackward(dy, n, p, seed, offset);
  }
  // ---- end normalisation, activations, dropout ----
  void AddGhostSquaredNorms(const float* a, int64_t in, const float* d, int64_t out, int64_t batch,
                            double* squared_norms) override {
    kernels::AddGhostSquaredNorms(a, in, d, out, batch, squared_norms);
  }
  void ClipFactors(const double* squared_norms, int64_t batch, const ClipFactorParams& p,
                   float* factors) override {
    kernels::ClipFactors(squared_norms, batch, p, factors);
  }
  void ScaleRows(float* m, int64_t rows, int64_t cols, const float* factors) override {
    kernels::ScaleRows(m, rows, cols, factors);
  }
  void AccumulateOnGrid(const float* x, int64_t n, int exponent, double limit, int64_t* acc,
                        int64_t* rejected) override {
    kernels::AccumulateOnGrid(x, n, exponent, limit, acc, rejected);
  }
  void AddUnits(const int64_t* units, int64_t n, int64_t* acc) override {
    kernels::AddUnits(units, n, acc);
  }
  void UnitsToFloat(const int64_t* acc, int64_t n, int exponent, double divisor,
                    float* out) override {
    kernels::UnitsToFloat(acc, n, exponent, divisor, out);
  }
  void UpdatePipeline(const UpdatePipelineParams& p, const float* local, const float* global,
                      int64_t n, float* out, double* scratch, UpdatePipelineStats* stats) override {
    kernels::UpdatePipeline(p, local, global, n, out, scratch, stats);
  }

 private:
  static constexpr int64_t kAlignment = 256;
  static void Copy(void* dst, const void* src, int64_t bytes) {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
};

}  // namespace

std::unique_ptr<Backend> OpenCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace huddle::kernels
