// Internal to models/: the device buffers, forward/backward passes and input checks that
// TrainModel, EvaluateModel, TrainDpSgd and the data-parallel trainer share. Not part of the public
// API (include models/model.h or models/dp_sgd.h).
//
// Everything runs on one kernels::Backend (the CPU or a GPU): the model is uploaded once
// (UploadParams), trained in device memory, and downloaded once (DownloadParams); the data are made
// device-addressable once per call (LoadData); the minibatch rows of an epoch travel in one copy
// (SetOrder). Loss totals accumulate on the device and are read when the caller chooses
// (ReadTotals, one wait), so the inner loop never waits for the host.
//
// A leading scattering2d layer (a fixed feature extractor) is not one of the workspace's layers:
// LoadData transforms the data with it once, on the host, and the workspace's layer 0 is the
// spec's layer 1 (num_layers() counts the others; parameters are unaffected, it has none).
//
// Layer l of the spec reads layer l - 1's output (the gathered input for l = 0) and writes its own,
// [batch, output_size(l)] row-major (NCHW per example for images). ReLU, tanh, dropout and flatten
// work in place on their input's buffer where nothing needs that input afterwards; every other
// layer has its own output and output-gradient buffers. Layer l's trainable parameters are
// [first_param(l), first_param(l + 1)) (none for a layer without parameters); batch norm's
// running statistics follow every trainable parameter (Layout order).
// Thread-safety: a NetWorkspace is used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "data/dataset.h"
#include "kernels/backend.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "kernels/scattering.h"
#include "models/layers/layer_type.h"
#include "models/model.h"

namespace huddle::models::internal {

class NetWorkspace {
 public:
  // Buffers on `backend` (not owned; it must outlive the workspace) for a batch of up to
  // max_batch >= 1 rows; `training` also allocates the gradient buffers. ResourceExhausted when
  // the device is short of memory. Precondition: ValidateModelSpec(spec).ok().
  static StatusOr<std::unique_ptr<NetWorkspace>> Create(kernels::Backend& backend,
                                                        const ModelSpec& spec, int64_t max_batch,
                                                        bool training);

  kernels::Backend& backend() const { return *backend_; }
  size_t num_layers() const { return layers_.size(); }
  // Floats per example of the input (input_size()) and of layer l's output; the last layer's is
  // num_classes.
  int64_t input_size() const { return input_size_; }
  int64_t output_size(size_t l) const { return layers_[l].out_size; }
  int64_t capacity() const { return capacity_; }
  // Grows the batch buffers to max_batch rows (never shrinks); their contents are not kept.
  Status Reserve(int64_t max_batch);

  // Parameters: one upload before training, one download after (which waits).
  // Precondition: CheckParams(spec, params).ok().
  void UploadParams(const TensorList& params);
  Status DownloadParams(TensorList* params);
  // The parameters live in one device buffer of params_span() floats: parameter i at
  // params_base() + param_offset(i), each offset a multiple of kParamAlign floats (256 bytes, for
  // the GEMMs); the gaps are zero and stay zero. A packed host copy has the same layout
  // (PackParams / UnpackParams).
  static constexpr int64_t kParamAlign = 64;
  float* params_base() const { return params_.as<float>(); }
  int64_t params_span() const { return params_span_; }
  int64_t param_offset(size_t i) const { return offsets_[i]; }
  // *packed = the host tensors in the device layout, gaps zero; and back.
  void PackParams(const TensorList& params, std::vector<float>* packed) const;
  void UnpackParams(const std::vector<float>& packed, TensorList* params) const;

  // Makes the rows of `view` addressable by Gather (for a GPU: one upload of the view's rows; the
  // CPU reads the caller's dataset in place, which must then outlive the workspace). With a
  // scattering2d first layer, the view's rows are transformed into a dataset the workspace owns
  // (host memory: rows x the transform's output size; ResourceExhausted when it cannot be had)
  // and that is loaded instead. Precondition: CheckData (models/trainer.h) passed for the view.
  Status LoadData(const data::DatasetView& view);
  // Sets the rows Gather reads: positions[k] is a row of the loaded view (one copy to the device).
  Status SetOrder(const std::vector<int64_t>& positions);
  // Copies the rows order[begin, begin + count) into the input and label buffers.
  void Gather(int64_t begin, int64_t count);

  // Forward pass over the gathered batch, adding the loss totals into the device accumulator;
  // with training, also writes dLoss/dlogits (of the batch's mean loss) into layer_grad(last).
  // Dropout masks come from the dropout seed and a counter of training passes.
  void Forward(int64_t batch, bool training);
  void set_dropout_seed(uint64_t seed) {
    dropout_seed_ = seed;
    passes_ = 0;
  }
  // The training passes so far (the next Forward(training) is pass passes + 1).
  void set_dropout_pass(uint64_t passes) { passes_ = passes; }
  // The position of the gathered batch's first row in its step's global batch (a data-parallel
  // rank's slice): an element's mask is drawn by its row's position there, so that the masks do
  // not depend on how the global batch is spread over ranks. 0 by default.
  void set_dropout_first_row(int64_t row) { dropout_first_row_ = row; }
  // Backward pass after Forward(training=true): fills grad(i) for every parameter, last layer
  // first. `layer_done(l)`, when given, is called as soon as layer l's gradients (grad(i) for i
  // in [first_param(l), first_param(l + 1))) have been enqueued on the backend: a data-parallel
  // trainer starts reducing them while the earlier layers are still being differentiated.
  using LayerDone = std::function<void(size_t layer)>;
  void Backward(int64_t batch, const LayerDone& layer_done = {});

  // DP-SGD's two passes after Forward(training=true) on `batch` >= 1 rows of a model without
  // batch norm, whose dlogits are the gradient of the MEAN loss (rows scaled by 1/batch):
  // BackwardForNorms back-propagates into every layer_grad(l) and writes each row's squared
  // per-example gradient norm of the MEAN loss over all parameters into squared[0, batch) (device
  // memory): ghost norms for dense layers, the cheaper exact method per convolution
  // (kernels/conv.h), per-example sums for group norm. It clobbers grad(). ClippedGradientSum then
  // scales every row of every parameterised layer's output gradient by factors[row] and forms
  // the parameter gradients: with factors = batch * min(1, C / norm_row), grad() is the sum over
  // the batch of the per-example gradients clipped to C. Backpropagation is linear in each
  // example's output-gradient row and no layer mixes examples, so no per-example gradient is
  // materialised.
  void BackwardForNorms(int64_t batch, double* squared);
  void ClippedGradientSum(int64_t batch, const float* factors);
  // SyncBatchNorm: how a data-parallel trainer makes a batch-norm layer's statistics those of
  // the global batch spread over its ranks (kernels/batch_norm.h's steps 2 and 7). Forward and
  // Backward call it, on the training thread, once per batch-norm layer each
  // (models/layers/layer_type.h says what it must do).
  using BatchNormSync = layers::BatchNormSync;
  // nullptr (the default): the batch is all there is (one process).
  void set_batch_norm_sync(BatchNormSync* sync) { sync_ = sync; }
  bool batch_norm() const { return batch_norm_; }

  // One SGD step on every trainable parameter from grad(i). Momentum buffers are zeroed on first
  // use.
  Status Step(const kernels::SgdHyper& hyper);
  // The momentum buffers, one per trainable parameter (empty before a step with momentum): for
  // checkpoints.
  // UploadVelocity allocates them; `velocity` must be empty or match the parameters' sizes.
  Status DownloadVelocity(TensorList* velocity);
  Status UploadVelocity(const TensorList& velocity);
  // Allocates zeroed momentum buffers unless they exist; velocity(i) is parameter i's (nullptr
  // before they exist).
  Status EnsureVelocity();
  float* velocity(size_t i) const { return velocity_.empty() ? nullptr : velocity_[i].as<float>(); }

  // The loss totals accumulated since the last reset (waits for the device).
  StatusOr<kernels::LossAccumulator> ReadTotals();
  void ResetTotals();

  // Raw device buffers. Row-major.
  const float* input() const { return x_.as<float>(); }  // [batch, input_size()]
  // Output of layer l after Forward (logits for the last), and dLoss/d that output after Backward.
  float* layer_output(size_t l) const { return layers_[l].out; }  // [batch, output_size(l)]
  float* layer_grad(size_t l) const { return layers_[l].dout; }   // training only
  size_t num_params() const { return sizes_.size(); }
  // Parameters [0, num_trainable()) are trained by gradients; the rest are batch norm's running
  // statistics, at params_base() + trainable_span() onwards.
  size_t num_trainable() const { return num_trainable_; }
  int64_t trainable_span() const {
    return num_trainable_ < offsets_.size() ? offsets_[num_trainable_] : params_span_;
  }
  // Index of layer l's first trainable parameter, or of the next layer's with parameters for a
  // layer without (l <= num_layers(); first_param(num_layers()) = num_trainable()).
  size_t first_param(size_t l) const { return first_param_[l]; }
  int64_t param_size(size_t i) const { return sizes_[i]; }
  float* param(size_t i) const { return params_base() + offsets_[i]; }
  // Gradients (training only), in the parameters' layout: grad(i) = grads_base() + param_offset(i).
  float* grads_base() const { return grads_.as<float>(); }
  float* grad(size_t i) const { return grads_base() + offsets_[i]; }

 private:
  // One layer's spec, shapes and buffers (its kind's passes are in models/layers/).
  using Layer = layers::LayerState;

  NetWorkspace(kernels::Backend& backend, const ModelSpec& spec, bool training);
  // Loads `view` as is (LoadData's work after any transform).
  Status LoadRows(const data::DatasetView& view);
  const float* in(size_t l) const { return l == 0 ? x_.as<float>() : layers_[l - 1].out; }
  float* din(size_t l) const { return l == 0 ? nullptr : layers_[l - 1].dout; }
  // Layer l's backward pass: its parameters' gradients (when `params`) and its input's gradient
  // (for l > first_trained_). BackwardLayer stops at first_trained_.
  void BackwardLayer(size_t l, int64_t batch, bool params);
  // What layer l's passes read and write for `batch` rows of a step of `global_rows`.
  layers::LayerPass PassFor(size_t l, int64_t batch, int64_t global_rows) const;

  kernels::Backend* backend_;
  std::vector<Layer> layers_;
  int64_t input_size_ = 0;
  std::vector<int64_t> sizes_;    // elements of each parameter, Layout order
  std::vector<int64_t> offsets_;  // where each starts in params_, in floats
  int64_t params_span_ = 0;       // floats in params_
  size_t num_trainable_ = 0;
  std::vector<size_t> first_param_;  // per layer, and num_trainable_ at the end
  size_t first_trained_ = 0;         // the first layer with parameters
  bool batch_norm_ = false;
  bool training_ = false;
  int64_t capacity_ = 0;
  uint64_t dropout_seed_ = 0, passes_ = 0;
  int64_t dropout_first_row_ = 0;
  kernels::DeviceBuffer x_;                      // [capacity, input_size]
  kernels::DeviceBuffer labels_;                 // [capacity] int32
  kernels::DeviceBuffer scratch_;                // convolutions' scratch, the largest layer's
  kernels::DeviceBuffer params_;                 // the model, one buffer (see params_base)
  std::vector<float> packed_;                    // host staging of UploadParams / DownloadParams
  kernels::DeviceBuffer grads_;                  // dLoss/d params (training), params_ layout
  std::vector<kernels::DeviceBuffer> velocity_;  // momentum, allocated on first use
  kernels::DeviceBuffer totals_;                 // one LossAccumulator
  BatchNormSync* sync_ = nullptr;
  // Data: features [rows, input_dim] and labels [rows] addressable by the backend; view_rows_
  // maps a view position to a row there (empty: identity, the rows were uploaded in view order).
  const float* features_ = nullptr;
  const int32_t* data_labels_ = nullptr;
  kernels::DeviceBuffer data_features_buffer_, data_labels_buffer_;
  std::vector<int64_t> view_rows_;
  // A leading scattering2d: its plan, and the transformed rows of the loaded view.
  std::unique_ptr<kernels::ScatteringPlan> scattering_;
  data::Dataset scattered_;
  kernels::DeviceBuffer order_;  // int64 rows of the current order
  int64_t order_capacity_ = 0;
  std::vector<int64_t> order_host_;
};

// options.backend, or a CPU backend created into *owned when it is null.
kernels::Backend& BackendFor(const TrainOptions& options, std::unique_ptr<kernels::Backend>* owned);

}  // namespace huddle::models::internal
