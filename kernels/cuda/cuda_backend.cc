// The CUDA backend: one GPU, one non-blocking stream, one cuBLAS handle. Kernels are enqueued and
// return at once; the host waits only in CopyToHost and Synchronize.
//
// Host -> device copies go through a ring of pinned staging slots: the caller's bytes are copied
// into a free slot and the DMA is enqueued from there, so the caller may reuse its memory at once
// and the copy never forces a wait on earlier kernels (a slot is reused only after the event
// recorded behind its last copy has fired; in steady state that is long past).
//
// Errors: launch and cuBLAS failures are recorded (the first one wins) and returned by the next
// CopyToHost or Synchronize; after one, every later call returns it again.
#include "kernels/cuda/cuda_backend.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "kernels/cuda/batch_norm.h"
#include "kernels/cuda/launch.h"

namespace huddle::kernels::cuda {
namespace {

constexpr int64_t kStagingSlotBytes = int64_t{4} << 20;
constexpr int kStagingSlots = 4;

class CudaBackend final : public Backend {
 public:
  CudaBackend() = default;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  ~CudaBackend() override {
    Bind();
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (Slot& slot : slots_) {
      if (slot.event != nullptr) cudaEventDestroy(slot.event);
      if (slot.host != nullptr) cudaFreeHost(slot.host);
    }
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Creates the stream, handle and staging ring on GPU `ordinal`.
  Status Init(int ordinal) {
    ordinal_ = ordinal;
    HUDDLE_RETURN_IF_ERROR(Check(cudaSetDevice(ordinal), "cudaSetDevice"));
    cudaDeviceProp prop;
    HUDDLE_RETURN_IF_ERROR(
        Check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties"));
    name_ = absl::StrFormat("cuda:%d (%s, sm_%d%d, %.1f GiB)", ordinal, prop.name, prop.major,
                            prop.minor, static_cast<double>(prop.totalGlobalMem) / (1 << 30));
    std::string why;
    if (!KernelImageLoadable(&why)) {
      return absl::FailedPreconditionError(
          absl::StrCat(name_, " cannot run this build's kernels (built for sm_80 and sm_90): ", why,
                       "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=", prop.major, prop.minor));
    }
    HUDDLE_RETURN_IF_ERROR(
        Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS) {
      blas_ = nullptr;
      return absl::FailedPreconditionError(absl::StrCat(name_, ": cublasCreate failed"));
    }
    cublasSetStream(blas_, stream_);
    for (Slot& slot : slots_) {
      HUDDLE_RETURN_IF_ERROR(
          Check(cudaMallocHost(&slot.host, static_cast<size_t>(kStagingSlotBytes)),
                "cudaMallocHost (staging)"));
      HUDDLE_RETURN_IF_ERROR(
          Check(cudaEventCreateWithFlags(&slot.event, cudaEventDisableTiming), "cudaEventCreate"));
    }
    return absl::OkStatus();
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }

  StatusOr<DeviceBuffer> Allocate(int64_t bytes) override {
    Bind();
    if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("allocate ", bytes, " bytes"));
    if (bytes == 0) return DeviceBuffer();
    void* data = nullptr;
    const cudaError_t err = cudaMalloc(&data, static_cast<size_t>(bytes));
    if (err != cudaSuccess) {
      cudaGetLastError();  // allocation failures are not sticky: clear it
      return absl::ResourceExhaustedError(
          absl::StrCat(name_, ": cannot allocate ", bytes, " bytes: ", cudaGetErrorString(err)));
    }
    return DeviceBuffer(this, data, bytes);
  }
  void Free(void* data) override {
    Bind();
    cudaFree(data);
  }

  void CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    Bind();
    auto* out = static_cast<char*>(dst);
    const auto* in = static_cast<const char*>(src);
    for (int64_t done = 0; done < bytes;) {
      const int64_t chunk = std::min(kStagingSlotBytes, bytes - done);
      Slot& slot = slots_[next_slot_];
      next_slot_ = (next_slot_ + 1) % kStagingSlots;
      Record(cudaEventSynchronize(slot.event), "cudaEventSynchronize");
      std::memcpy(slot.host, in + done, static_cast<size_t>(chunk));
      Record(cudaMemcpyAsync(out + done, slot.host, static_cast<size_t>(chunk),
                             cudaMemcpyHostToDevice, stream_),
             "cudaMemcpyAsync (to device)");
      Record(cudaEventRecord(slot.event, stream_), "cudaEventRecord");
      done += chunk;
    }
  }
  Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    Bind();
    if (bytes > 0) {
      Record(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_),
             "cudaMemcpyAsync (to host)");
    }
    return Synchronize();
  }
  void CopyOnDevice(void* dst, const void* src, int64_t bytes) override {
    Bind();
    if (bytes > 0) {
      Record(
          cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpyAsync (on device)");
    }
  }
  void Zero(void* dst, int64_t bytes) override {
    Bind();
    if (bytes > 0) Record(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), stream_), "memset");
  }
  Status Synchronize() override {
    Bind();
    Record(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return error_;
  }

  // Row-major y[b, o] = x[b, :] · w[o, :] is, column-major, yᵀ (out x batch) = wᵀᵀ · xᵀ: a
  // transposed-A GEMM on the same buffers (kernels/dense.h's layout, no copies).
  void DenseForward(const DenseShape& s, const float* x, const float* w, const float* bias,
                    float* y) override {
    Bind();
    const float one = 1.0f, zero = 0.0f;
    Blas(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, Int(s.out), Int(s.batch), Int(s.in), &one, w,
                     Int(s.in), x, Int(s.in), &zero, y, Int(s.out)),
         "cublasSgemm (dense forward)");
    LaunchAddBias(stream_, bias, s.batch, s.out, y);
    Launched("AddBias");
  }
  // dwᵀ (in x out) = xᵀ · dy and dxᵀ (in x batch) = wᵀ · dyᵀ, column-major.
  void DenseBackward(const DenseShape& s, const float* x, const float* w, const float* dy,
                     float* dw, float* dbias, float* dx) override {
    Bind();
    const float one = 1.0f, zero = 0.0f;
    Blas(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, Int(s.in), Int(s.out), Int(s.batch), &one, x,
                     Int(s.in), dy, Int(s.out), &zero, dw, Int(s.in)),
         "cublasSgemm (weight gradient)");
    LaunchColumnSums(stream_, dy, s.batch, s.out, dbias);
    Launched("ColumnSums");
    if (dx != nullptr) {
      Blas(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, Int(s.in), Int(s.batch), Int(s.out), &one,
                       w, Int(s.in), dy, Int(s.out), &zero, dx, Int(s.in)),
           "cublasSgemm (input gradient)");
    }
  }
  void ReluForward(float* y, int64_t n) override {
    Bind();
    LaunchReluForward(stream_, y, n);
    Launched("ReluForward");
  }
  void ReluBackward(const float* y, float* dy, int64_t n) override {
    Bind();
    LaunchReluBackward(stream_, y, dy, n);
    Launched("ReluBackward");
  }
  void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch,
                           int64_t classes, float* dlogits, LossAccumulator* totals) override {
    Bind();
    LaunchSoftmaxCrossEntropy(stream_, logits, labels, batch, classes, dlogits, totals);
    Launched("SoftmaxCrossEntropy");
  }
  void SgdStep(const SgdHyper& hyper, const float* grad, float* param, float* velocity,
               int64_t n) override {
    Bind();
    LaunchSgdStep(stream_, hyper, grad, param, velocity, n);
    Launched("SgdStep");
  }
  void GatherRows(const float* features, const int32_t* labels, int64_t cols, const int64_t* rows,
                  int64_t count, float* x, int32_t* y) override {
    Bind();
    LaunchGatherRows(stream_, features, labels, cols, rows, count, x, y);
    Launched("GatherRows");
  }
  void BatchNormSums(const float* x, int64_t batch, int64_t features, int64_t spatial,
                     double* sums) override {
    Bind();
    LaunchBatchNormSums(stream_, x, batch, features, spatial, sums);
    Launched("BatchNormSums");
  }
  void BatchNormMoments(const double* sums, int64_t count, int64_t features, double eps,
                        float* mean, float* invstd) override {
    Bind();
    LaunchBatchNormMoments(stream_, sums, count, features, eps, mean, invstd);
    Launched("BatchNormMoments");
  }
  void BatchNormUpdateRunning(const double* sums, int64_t count, int64_t features, double momentum,
                              float* running_mean, float* running_var) override {
    Bind();
    LaunchBatchNormUpdateRunning(stream_, sums, count, features, momentum, running_mean,
                                 running_var);
    Launched("BatchNormUpdateRunning");
  }
  void BatchNormInvStd(const float* var, int64_t features, double eps, float* invstd) override {
    Bind();
    LaunchBatchNormInvStd(stream_, var, features, eps, invstd);
    Launched("BatchNormInvStd");
  }
  void BatchNormForward(const float* x, int64_t batch, int64_t features, int64_t spatial,
                        const float* mean, const float* invstd, const float* gamma,
                        const float* beta, float* y) override {
    Bind();
    LaunchBatchNormForward(stream_, x, batch, features, spatial, mean, invstd, gamma, beta, y);
    Launched("BatchNormForward");
  }
  void BatchNormBackwardSums(const float* dy, const float* x, const float* mean,
                             const float* invstd, int64_t batch, int64_t features, int64_t spatial,
                             double* sums) override {
    Bind();
    LaunchBatchNormBackwardSums(stream_, dy, x, mean, invstd, batch, features, spatial, sums);
    Launched("BatchNormBackwardSums");
  }
  void BatchNormParamGrads(const double* sums, int64_t features, float* dgamma,
                           float* dbeta) override {
    Bind();
    LaunchBatchNormParamGrads(stream_, sums, features, dgamma, dbeta);
    Launched("BatchNormParamGrads");
  }
  void BatchNormBackwardInput(const float* dy, const float* x, const float* mean,
                              const float* invstd, const float* gamma, const double* sums,
                              int64_t count, int64_t batch, int64_t features, int64_t spatial,
                              float* dx) override {
    Bind();
    LaunchBatchNormBackwardInput(stream_, dy, x, mean, invstd, gamma, sums, count, batch, features,
                                 spatial, dx);
    Launched("BatchNormBackwardInput");
  }
  // ---- Convolution and pooling (kernels/conv.h, kernels/pool.h; kernels/cuda/conv.cu, pool.cu) --
  void Conv2dForward(const Conv2dShape& s, const float* x, const float* w, const float* bias,
                     float* y, float* scratch) override {
    Bind();
    Blas(LaunchConv2dForward(stream_, blas_, s, x, w, bias, y, scratch), "conv2d forward");
    Launched("Conv2dForward");
  }
  void Conv2dBackward(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                      float* dw, float* dbias, float* dx, float* scratch) override {
    Bind();
    Blas(LaunchConv2dBackward(stream_, blas_, s, x, w, dy, dw, dbias, dx, scratch),
         "conv2d backward");
    Launched("Conv2dBackward");
  }
  void AddConv2dSquaredNorms(const Conv2dShape& s, const float* x, const float* dy,
                             double* squared_norms, float* scratch) override {
    Bind();
    Blas(LaunchAddConv2dSquaredNorms(stream_, blas_, s, x, dy, squared_norms, scratch),
         "conv2d per-example norms");
    Launched("AddConv2dSquaredNorms");
  }
  void MaxPool2dForward(const Pool2dShape& s, const float* x, float* y, int32_t* argmax) override {
    Bind();
    LaunchMaxPool2dForward(stream_, s, x, y, argmax);
    Launched("MaxPool2dForward");
  }
  void MaxPool2dBackward(const Pool2dShape& s, const float* dy, const int32_t* argmax,
                         float* dx) override {
    Bind();
    LaunchMaxPool2dBackward(stream_, s, dy, argmax, dx);
    Launched("MaxPool2dBackward");
  }
  void AvgPool2dForward(const Pool2dShape& s, const float* x, float* y) override {
    Bind();
    LaunchAvgPool2dForward(stream_, s, x, y);
    Launched("AvgPool2dForward");
  }
  void AvgPool2dBackward(const Pool2dShape& s, const float* dy, float* dx) override {
    Bind();
    LaunchAvgPool2dBackward(stream_, s, dy, dx);
    Launched("AvgPool2dBackward");
  }
  // ---- end convolution and pooling ----
  // ---- Normalisation, activations, dropout (kernels/group_norm.h, activation.h, dropout.h;
  // kernels/cuda/group_norm.cu, activation.cu) ----
  void GroupNormForward(const GroupNormShape& s, const float* x, const float* gamma,
                        const float* beta, double eps, float* y, float* mean,
                        float* invstd) override {
    Bind();
    LaunchGroupNormForward(stream_, s, x, gamma, beta, eps, y, mean, invstd);
    Launched("GroupNormForward");
  }
  void GroupNormBackward(const GroupNormShape& s, const float* x, const float* dy,
                         const float* gamma, const float* mean, const float* invstd, float* dgamma,
                         float* dbeta, float* dx) override {
    Bind();
    LaunchGroupNormBackward(stream_, s, x, dy, gamma, mean, invstd, dgamma, dbeta, dx);
    Launched("GroupNormBackward");
  }
  void AddGroupNormSquaredNorms(const GroupNormShape& s, const float* x, const float* dy,
                                const float* mean, const float* invstd,
                                double* squared_norms) override {
    Bind();
    LaunchAddGroupNormSquaredNorms(stream_, s, x, dy, mean, invstd, squared_norms);
    Launched("AddGroupNormSquaredNorms");
  }
  void TanhForward(float* y, int64_t n) override {
    Bind();
    LaunchTanhForward(stream_, y, n);
    Launched("TanhForward");
  }
  void TanhBackward(const float* y, float* dy, int64_t n) override {
    Bind();
    LaunchTanhBackward(stream_, y, dy, n);
    Launched("TanhBackward");
  }
  void DropoutForward(float* x, int64_t n, float p, uint64_t seed, uint64_t offset) override {
    Bind();
    LaunchDropout(stream_, x, n, p, seed, offset);
    Launched("DropoutForward");
  }
  void DropoutBackward(float* dy, int64_t n, float p, uint64_t seed, uint64_t offset) override {
    Bind();
    LaunchDropout(stream_, dy, n, p, seed, offset);
    Launched("DropoutBackward");
  }
  // ---- end normalisation, activations, dropout ----
  void AddGhostSquaredNorms(const float* a, int64_t in, const float* d, int64_t out, int64_t batch,
                            double* squared_norms) override {
    Bind();
    LaunchAddGhostSquaredNorms(stream_, a, in, d, out, batch, squared_norms);
    Launched("AddGhostSquaredNorms");
  }
  void ClipFactors(const double* squared_norms, int64_t batch, const ClipFactorParams& p,
                   float* factors) override {
    Bind();
    LaunchClipFactors(stream_, squared_norms, batch, p, factors);
    Launched("ClipFactors");
  }
  void ScaleRows(float* m, int64_t rows, int64_t cols, const float* factors) override {
    Bind();
    LaunchScaleRows(stream_, m, rows, cols, factors);
    Launched("ScaleRows");
  }
  void AccumulateOnGrid(const float* x, int64_t n, int exponent, double limit, int64_t* acc,
                        int64_t* rejected) override {
    Bind();
    LaunchAccumulateOnGrid(stream_, x, n, exponent, limit, acc, rejected);
    Launched("AccumulateOnGrid");
  }
  void AddUnits(const int64_t* units, int64_t n, int64_t* acc) override {
    Bind();
    LaunchAddUnits(stream_, units, n, acc);
    Launched("AddUnits");
  }
  void UnitsToFloat(const int64_t* acc, int64_t n, int exponent, double divisor,
                    float* out) override {
    Bind();
    LaunchUnitsToFloat(stream_, acc, n, exponent, divisor, out);
    Launched("UnitsToFloat");
  }
  void UpdatePipeline(const UpdatePipelineParams& p, const float* local, const float* global,
                      int64_t n, float* out, double* scratch, UpdatePipelineStats* stats) override {
    Bind();
    LaunchUpdatePipeline(stream_, p, local, global, n, out, scratch, stats);
    Launched("UpdatePipeline");
  }

 private:
  struct Slot {
    void* host = nullptr;         // pinned, kStagingSlotBytes
    cudaEvent_t event = nullptr;  // recorded after the slot's last copy
  };

  // cuBLAS takes int dimensions; the trainers' shapes are validated far below 2^31.
  static int Int(int64_t v) { return static_cast<int>(v); }

  Status Check(cudaError_t err, const char* what) const {
    if (err == cudaSuccess) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", ordinal_, ": ", what, ": ", cudaGetErrorString(err)));
  }
  void Record(cudaError_t err, const char* what) {
    if (err != cudaSuccess && error_.ok()) error_ = Check(err, what);
  }
  void Launched(const char* kernel) { Record(cudaGetLastError(), kernel); }
  // Makes this GPU the calling thread's current device: a backend may be opened on one thread
  // and used on another (the client's agent thread), where cudaMalloc, cuBLAS and launches would
  // otherwise go to that thread's device (0 by default). cudaGetDevice is a host-side read.
  void Bind() {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != ordinal_) {
      Record(cudaSetDevice(ordinal_), "cudaSetDevice");
    }
  }
  void Blas(cublasStatus_t status, const char* what) {
    if (status != CUBLAS_STATUS_SUCCESS && error_.ok()) {
      error_ = absl::InternalError(
          absl::StrCat(name_, ": ", what, " failed: ", cublasGetStatusString(status)));
    }
  }

  int ordinal_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::array<Slot, kStagingSlots> slots_{};
  int next_slot_ = 0;
  Status error_;  // the first asynchronous failure, sticky
};

}  // namespace

int DeviceCount(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *why = cudaGetErrorString(err);
    cudaGetLastError();
    return 0;
  }
  if (count == 0) *why = "the CUDA runtime reports no GPU";
  return count;
}

StatusOr<std::unique_ptr<Backend>> OpenBackend(int ordinal) {
  auto backend = std::make_unique<CudaBackend>();
  HUDDLE_RETURN_IF_ERROR(backend->Init(ordinal));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace huddle::kernels::cuda
