// Internal to models/: what one layer kind is, as a table of its rules and passes. Every kind of
// models/model.h's LayerKind has one LayerType, defined in its own file under models/layers/ and
// listed once in the registry (models/layers/registry.h). model.cc (shapes, layout,
// initialisation) and NetWorkspace (buffers, forward, backward, DP-SGD's per-example norms) only
// ever reach a kind through its LayerType: adding a kind is one file here, one line in the
// registry and the enum, and its kernels (kernels/<op>.h, _cpu.cc, .cu).
//
// A LayerType is plain constant data (names, properties, function pointers); the functions are
// stateless and work on what they are handed: the layer's spec and shapes (LayerState) and the
// buffers of the pass (LayerPass). Thread-safety: the tables are immutable.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/backend.h"
#include "models/model.h"

namespace huddle::models::layers {

using Shape = std::vector<int64_t>;

// How a data-parallel trainer makes a batch-norm layer's statistics those of the global batch
// spread over its ranks (kernels/batch_norm.h's steps 2 and 7); NetWorkspace::BatchNormSync.
class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  // Rows of the current step's global batch over all ranks (>= 1).
  virtual int64_t global_rows() const = 0;
  // Sums the `count` doubles at `sums` (backend memory, enqueued work pending) over the ranks,
  // in place. A failure is kept by the implementation and reported after the step.
  virtual void AllReduceSum(double* sums, int64_t count) = 0;
};

// One workspace layer: its spec, per-example shapes, and the buffers its kernels keep between
// the forward and the backward pass. Buffers sized by the batch capacity are (re)made by
// LayerType::reserve; out/dout are owned by NetWorkspace (its own, or its input's when in place).
struct LayerState {
  LayerSpec spec;
  Shape in_shape, out_shape;          // per example
  int64_t in_size = 0, out_size = 0;  // floats per example
  bool in_place = false;              // output and its gradient alias the input's
  size_t first_state = 0;             // its first state tensor's parameter index (batch norm's
                                      // running statistics; 0: none, state follows the trainable)
  float* out = nullptr;               // [capacity, out_size]
  float* dout = nullptr;
  kernels::DeviceBuffer out_buffer, dout_buffer;
  kernels::DeviceBuffer mean, invstd, sums;  // batch norm [C], [C], [2C] double; group norm
                                             // [capacity, groups] mean and invstd
  kernels::DeviceBuffer argmax;              // max pooling [capacity, out_size] int32
  uint64_t dropout_seed = 0;                 // the last training pass's
};

// What a pass hands one layer: where its input, parameters and gradients are. Pointers are
// backend memory; `dx` is nullptr where no input gradient is wanted (the first trained layer),
// `weight`/`bias` and their gradients nullptr for a kind without parameters.
struct LayerPass {
  kernels::Backend& backend;
  int64_t batch = 0;              // rows of this pass (0: a data-parallel rank's empty share)
  int64_t global_rows = 0;        // rows of the step's global batch (batch norm)
  const float* x = nullptr;       // [batch, in_size]
  float* dx = nullptr;            // [batch, in_size] or nullptr
  const float* weight = nullptr;  // trainable parameter 0
  const float* bias = nullptr;    // trainable parameter 1
  float* dweight = nullptr;       // grad of parameter 0
  float* dbias = nullptr;         // grad of parameter 1
  float* running_mean = nullptr;  // batch norm's state
  float* running_var = nullptr;
  float* scratch = nullptr;       // convolutions' scratch (LayerType::reserve's floats)
  BatchNormSync* sync = nullptr;  // nullptr: the batch is all there is
  bool training = false;          // Forward: batch statistics, dropout
  uint64_t pass_seed = 0;         // dropout: the training pass's seed (per workspace layer
  size_t layer_index = 0;         //   DeriveSeed(pass_seed, layer_index))
  uint64_t dropout_offset = 0;    // dropout: first element's position in the global batch
};

// A query of the shape rule: layer `index` of a model, with its input shape; `where` names it
// for errors ("model layer 3 (conv2d)").
struct ShapeQuery {
  const LayerSpec& spec;
  const Shape& in;
  size_t index = 0;
  const std::string& where;
};

// A layer's tensors in Layout order: trainable ones (named <prefix><k>.<suffix>) and state that
// travels with the model but is not trained by gradients (after every trainable tensor).
struct TensorShape {
  const char* suffix;
  Shape shape;
};
struct LayerTensors {
  std::vector<TensorShape> trainable, state;
};

// What the weights of a dense or convolutional layer before this one are initialised for.
enum class InitGain {
  kLookPast,  // normalisation, pooling, dropout, flatten: decided by the next layer
  kRelu,      // He/Kaiming uniform
  kLinear,    // LeCun uniform (tanh, another weighted layer, the output)
};

// Whether the layer may run on its input's buffer.
enum class InPlace {
  kNever,
  kIfInputFree,  // where nothing reads the input afterwards (not on the gathered input)
  kAlways,       // a view of its input (except as the first layer)
};

struct LayerType {
  LayerKind kind;
  const char* name = "";          // config and wire name ("conv2d")
  const char* param_prefix = "";  // tensor names ("conv" -> conv0.weight); "": no tensors
  size_t num_trainable = 0;       // trainable tensors (0, or 2: weight and bias)
  InitGain init_gain = InitGain::kLinear;
  InPlace in_place = InPlace::kNever;
  bool backward_reads_output = false;  // its backward pass reads its output (ReLU, tanh)
  bool runs_on_empty_batch = false;    // takes part in a pass with 0 rows (batch norm's sums)

  // Its options in a job's YAML, in the order they are read.
  std::span<const LayerOption> options;
  // Appends to DescribeModel's line what it shows of this kind's own options, after the common
  // out, kernel, stride, padding and groups (nullptr: nothing).
  void (*describe)(const LayerSpec& spec, std::string* line) = nullptr;

  // Shape rule: the output shape for one example, and *params the number of its parameters
  // (state included), or InvalidArgument naming `where` and what does not fit.
  StatusOr<Shape> (*output_shape)(const ShapeQuery& q, int64_t* params) = nullptr;
  // Its tensors for input shape `in` (nullptr: none).
  LayerTensors (*tensors)(const LayerSpec& spec, const Shape& in) = nullptr;
  // Fills tensor `index` of tensors()'s trainable-then-state order (zeros on entry); `seed` is
  // the tensor's own (InitModel: DeriveSeed(seed, position in Layout)), `feeds_relu` the gain.
  // nullptr: zeros.
  void (*init)(size_t index, const Shape& shape, bool feeds_relu, uint64_t seed,
               std::vector<float>* data) = nullptr;
  // Allocations made once when the workspace is made (nullptr: none).
  Status (*allocate)(kernels::Backend& backend, bool training, LayerState* layer) = nullptr;
  // Buffers sized by the batch capacity; returns the convolution scratch it needs, in floats
  // (nullptr: none, 0).
  StatusOr<int64_t> (*reserve)(kernels::Backend& backend, int64_t max_batch,
                               LayerState* layer) = nullptr;
  // Forward over the batch: layer->out from pass.x (a copy first where not in place).
  void (*forward)(const LayerPass& pass, LayerState* layer) = nullptr;
  // Backward: the parameter gradients (when `params`; kinds that always form them ignore it)
  // and the input gradient into pass.dx (when not nullptr), from layer.dout.
  void (*backward)(const LayerPass& pass, const LayerState& layer, bool params) = nullptr;
  // DP-SGD: adds each row's squared gradient norm over this layer's parameters, from layer.dout,
  // into squared[0, batch). nullptr: the kind has no per-example norm (no parameters, or batch
  // norm, which mixes examples: DP-SGD refuses it).
  void (*add_squared_norms)(const LayerPass& pass, const LayerState& layer,
                            double* squared) = nullptr;
};

// Shared helpers of the kinds' files (models/layers/common.cc).

// InvalidArgument "<where>: <what> is <value>; it must be in [min, max]" when out of range.
Status CheckRange(const std::string& where, absl::string_view what, int64_t value, int64_t min,
                  int64_t max);
// InvalidArgument unless `in` is [channels, height, width].
Status NeedsImage(const ShapeQuery& q);
// A window layer's (conv2d, pools) output side, or an error naming the dimension.
StatusOr<int64_t> WindowOut(const std::string& where, absl::string_view dim, int64_t size,
                            const LayerSpec& l);
// Product of the shape (elements per example).
int64_t Product(const Shape& shape);
// Values per channel of one example (1 for flat features).
int64_t Spatial(const Shape& shape);
// The weight (index 0) uniform in [-b, b], b = sqrt((feeds_relu ? 6 : 3) / fan_in), fan_in the
// product of the shape after its first dimension; the bias (index 1) zeros.
void InitFanInUniform(size_t index, const Shape& shape, bool feeds_relu, uint64_t seed,
                      std::vector<float>* data);
// Weight (index 0) ones, bias zeros: normalisation layers.
void InitOnes(size_t index, const Shape& shape, bool feeds_relu, uint64_t seed,
              std::vector<float>* data);
// Copies the input into the output unless they are the same buffer (element-wise kinds).
void CopyUnlessInPlace(const LayerPass& pass, const LayerState& layer);
// The input gradient of an element-wise kind before its own factor: dx = dy unless in place.
// Returns false when no input gradient is wanted.
bool StartElementwiseBackward(const LayerPass& pass, const LayerState& layer);

}  // namespace huddle::models::layers
