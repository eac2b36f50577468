// Backend: one compute device (the CPU, or one CUDA GPU) with its memory, its ordered work queue
// and every kernel the trainers and the update pipeline use. Trainers are written once against
// this interface; each backend runs the same math (kernels/<op>.h documents it; the CPU reference
// in kernels/<op>_cpu.cc is the specification, the CUDA version in kernels/cuda/<op>.cu the fast
// one).
//
// Choosing a device: OpenBackend(ParseDeviceRequest("auto" | "cpu" | "cuda" | "cuda:N")). The
// backends form an ordered list (CUDA, then the CPU, always available); `auto` takes the first
// whose device is present. Asking for `cuda` where the CUDA plugin or its libraries are missing or
// the machine has no such GPU is an error that says which, never a silent fallback to the CPU.
//
// Memory and ordering: pointers passed to a backend's kernels point into DeviceBuffers that the
// same backend allocated (host memory for the CPU backend, device memory for CUDA). Every kernel
// and copy is enqueued in order on the backend's one stream and may run after the call returns
// (the CPU backend runs it at once); results become visible to the host only through CopyToHost,
// the one call that waits. Kernels never fail: the caller validates shapes and values first (the
// contracts of kernels/dense.h apply). Asynchronous device faults surface as the Status of the
// next CopyToHost or Synchronize.
//
// Thread-safety: a Backend is used by one thread at a time. Different Backends are independent.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "kernels/batch_norm.h"
#include "kernels/conv.h"
#include "kernels/dense.h"
#include "kernels/dp.h"
#include "kernels/grid_sum.h"
#include "kernels/group_norm.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "kernels/pool.h"
#include "kernels/update.h"

namespace huddle::kernels {

enum class DeviceKind { kCpu, kCuda };

// What a config asks for: `device: auto | cpu | cuda[:N]`.
struct DeviceRequest {
  enum class Kind { kAuto, kCpu, kCuda };
  Kind kind = Kind::kAuto;
  int index = 0;                 // the GPU ordinal, for kCuda
  std::string ToString() const;  // "auto", "cpu", "cuda:0"
};

// Parses "auto", "cpu", "cuda" (= "cuda:0") or "cuda:N" (N a decimal ordinal < 1024). The error
// quotes the text and lists the accepted forms.
StatusOr<DeviceRequest> ParseDeviceRequest(std::string_view text);

class Backend;

// Memory owned by one Backend: moved, never copied; freed through its backend (which must
// outlive it). A default-constructed or zero-byte buffer holds nullptr.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* backend, void* data, int64_t bytes)
      : backend_(backend), data_(data), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Release();
      backend_ = other.backend_;
      data_ = other.data_;
      bytes_ = other.bytes_;
      other.backend_ = nullptr;
      other.data_ = nullptr;
      other.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Release(); }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  inline void Release();
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind kind() const = 0;
  // For logs: "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3, sm_90, 79.2 GiB)".
  virtual std::string name() const = 0;

  // ---- Memory -------------------------------------------------------------------------------
  // `bytes` >= 0 of uninitialised memory, aligned to 256 bytes. ResourceExhausted names the size
  // and the device when it has too little free.
  virtual StatusOr<DeviceBuffer> Allocate(int64_t bytes) = 0;
  // Enqueues host -> device. `src` (any host memory) may be reused as soon as this returns.
  virtual void CopyToDevice(void* dst, const void* src, int64_t bytes) = 0;
  // Device -> host, after all earlier work: waits. The status reports any device fault since the
  // last wait (then the backend is unusable and every later call fails alike).
  virtual Status CopyToHost(void* dst, const void* src, int64_t bytes) = 0;
  // Enqueues device -> device (the ranges must not overlap) and memset-to-zero.
  virtual void CopyOnDevice(void* dst, const void* src, int64_t bytes) = 0;
  virtual void Zero(void* dst, int64_t bytes) = 0;
  // Waits for all enqueued work; status as for CopyToHost.
  virtual Status Synchronize() = 0;
  // Returns memory from Allocate (DeviceBuffer calls this; after all enqueued work using it).
  virtual void Free(void* data) = 0;

  // ---- Training kernels (kernels/dense.h, activation.h, loss.h, optimizer.h) -----------------
  virtual void DenseForward(const DenseShape& shape, const float* x, const float* w,
                            const float* bias, float* y) = 0;
  virtual void DenseBackward(const DenseShape& shape, const float* x, const float* w,
                             const float* dy, float* dw, float* dbias, float* dx) = 0;
  virtual void ReluForward(float* y, int64_t n) = 0;
  virtual void ReluBackward(const float* y, float* dy, int64_t n) = 0;
  // As kernels::SoftmaxCrossEntropy, with the totals ADDED into *totals (device memory).
  virtual void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch,
                                   int64_t classes, float* dlogits, LossAccumulator* totals) = 0;
  virtual void SgdStep(const SgdHyper& hyper, const float* grad, float* param, float* velocity,
                       int64_t n) = 0;
  // x[r, :] = features[rows[r], :] and y[r] = labels[rows[r]] for r in [0, count) (kernels/dp.h).
  virtual void GatherRows(const float* features, const int32_t* labels, int64_t cols,
                          const int64_t* rows, int64_t count, float* x, int32_t* y) = 0;

  // ---- Batch normalization (kernels/batch_norm.h) -------------------------------------------
  // x, y, dy, dx are [batch, features, spatial]; counts are values per feature (batch · spatial).
  virtual void BatchNormSums(const float* x, int64_t batch, int64_t features, int64_t spatial,
                             double* sums) = 0;
  virtual void BatchNormMoments(const double* sums, int64_t count, int64_t features, double eps,
                                float* mean, float* invstd) = 0;
  virtual void BatchNormUpdateRunning(const double* sums, int64_t count, int64_t features,
                                      double momentum, float* running_mean, float* running_var) = 0;
  virtual void BatchNormInvStd(const float* var, int64_t features, double eps, float* invstd) = 0;
  virtual void BatchNormForward(const float* x, int64_t batch, int64_t features, int64_t spatial,
                                const float* mean, const float* invstd, const float* gamma,
                                const float* beta, float* y) = 0;
  virtual void BatchNormBackwardSums(const float* dy, const float* x, const float* mean,
                                     const float* invstd, int64_t batch, int64_t features,
                                     int64_t spatial, double* sums) = 0;
  virtual void BatchNormParamGrads(const double* sums, int64_t features, float* dgamma,
                                   float* dbeta) = 0;
  virtual void BatchNormBackwardInput(const float* dy, const float* x, const float* mean,
                                      const float* invstd, const float* gamma, const double* sums,
                                      int64_t count, int64_t batch, int64_t features,
                                      int64_t spatial, float* dx) = 0;

  // ---- Convolution and pooling (kernels/conv.h, kernels/pool.h) ------------------------------
  // `scratch`: Conv2dScratchFloats(s) floats of this backend's memory.
  virtual void Conv2dForward(const Conv2dShape& s, const float* x, const float* w,
                             const float* bias, float* y, float* scratch) = 0;
  virtual void Conv2dBackward(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                              float* dw, float* dbias, float* dx, float* scratch) = 0;
  virtual void AddConv2dSquaredNorms(const Conv2dShape& s, const float* x, const float* dy,
                                     double* squared_norms, float* scratch) = 0;
  virtual void MaxPool2dForward(const Pool2dShape& s, const float* x, float* y,
                                int32_t* argmax) = 0;
  virtual void MaxPool2dBackward(const Pool2dShape& s, const float* dy, const int32_t* argmax,
                                 float* dx) = 0;
  virtual void AvgPool2dForward(const Pool2dShape& s, const float* x, float* y) = 0;
  virtual void AvgPool2dBackward(const Pool2dShape& s, const float* dy, float* dx) = 0;

  // ---- Normalisation, activations, dropout (kernels/group_norm.h, activation.h, dropout.h) ----
  virtual void GroupNormForward(const GroupNormShape& s, const float* x, const float* gamma,
                                const float* beta, double eps, float* y, float* mean,
                                float* invstd) = 0;
  virtual void GroupNormBackward(const GroupNormShape& s, const float* x, const float* dy,
                                 const float* gamma, const float* mean, const float* invstd,
                                 float* dgamma, float* dbeta, float* dx) = 0;
  virtual void AddGroupNormSquaredNorms(const GroupNormShape& s, const float* x, const float* dy,
                                        const float* mean, const float* invstd,
                                        double* squared_norms) = 0;
  virtual void TanhForward(float* y, int64_t n) = 0;
  virtual void TanhBackward(const float* y, float* dy, int64_t n) = 0;
  virtual void DropoutForward(float* x, int64_t n, float p, uint64_t seed, uint64_t offset) = 0;
  virtual void DropoutBackward(float* dy, int64_t n, float p, uint64_t seed, uint64_t offset) = 0;
  // ---- end normalisation, activations, dropout ----

  // ---- DP-SGD kernels (kernels/dp.h) ---------------------------------------------------------
  virtual void AddGhostSquaredNorms(const float* a, int64_t in, const float* d, int64_t out,
                                    int64_t batch, double* squared_norms) = 0;
  virtual void ClipFactors(const double* squared_norms, int64_t batch, const ClipFactorParams& p,
                           float* factors) = 0;
  virtual void ScaleRows(float* m, int64_t rows, int64_t cols, const float* factors) = 0;

  // ---- Exact sums on a power-of-two grid (kernels/grid_sum.h): DP-SGD's gradient sum ----------
  virtual void AccumulateOnGrid(const float* x, int64_t n, int exponent, double limit, int64_t* acc,
                                int64_t* rejected) = 0;
  virtual void AddUnits(const int64_t* units, int64_t n, int64_t* acc) = 0;
  virtual void UnitsToFloat(const int64_t* acc, int64_t n, int exponent, double divisor,
                            float* out) = 0;

  // ---- Update pipeline and aggregation (kernels/update.h) ------------------------------------
  virtual void UpdatePipeline(const UpdatePipelineParams& p, const float* local,
                              const float* global, int64_t n, float* out, double* scratch,
                              UpdatePipelineStats* stats) = 0;
};

inline void DeviceBuffer::Release() {
  if (backend_ != nullptr && data_ != nullptr) backend_->Free(data_);
  backend_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

// The device `request` names, opened. `cpu` never touches CUDA; `auto` loads the CUDA plugin
// (kernels/cuda_plugin.h) only where this host has an NVIDIA driver, and takes the CPU, quietly,
// where the plugin, its libraries or a GPU are missing; `cuda[:N]` loads it and fails
// (FailedPrecondition) saying what is missing: the plugin file (with the places looked in), a
// CUDA library it needs (the dynamic loader's message), a usable GPU (the CUDA runtime's
// message), or an ordinal past the GPUs present.
StatusOr<std::unique_ptr<Backend>> OpenBackend(const DeviceRequest& request);

// The CPU backend (always available).
std::unique_ptr<Backend> OpenCpuBackend();

// Whether this build made the CUDA plugin (libhuddle_cuda.so); cheap, loads nothing, and says
// nothing about this host.
bool BuiltWithCuda();
// GPUs usable here, loading the CUDA plugin first; the error says what is missing, as
// OpenBackend's.
StatusOr<int> CountCudaDevices();
// CountCudaDevices() or 0, and 0 without loading anything where this host has no NVIDIA driver.
int CudaDeviceCount();

}  // namespace huddle::kernels
