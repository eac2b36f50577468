// Classifier models as a sequence of layers: spec, shape checks, parameter layout,
// initialisation, training and evaluation.
//
// A ModelSpec is an input shape (one example: [features], or [channels, height, width] for
// images, NCHW) and a list of layers applied in order; the last layer's output, a vector of
// num_classes() values, is the logits of a softmax cross-entropy classifier. Layers:
//   dense {out}                        fully connected, weight [out, in], bias [out]; flat input
//   conv2d {out, kernel, stride, padding}  2-D convolution, weight [out, in, k, k], bias [out]
//   max_pool2d / avg_pool2d {kernel, stride, padding}  (stride defaults to kernel; average pooling
//                                      counts the padding, as PyTorch's count_include_pad)
//   batch_norm {}                      over the batch: BatchNorm1d on [features], BatchNorm2d (per
//                                      channel) on [channels, height, width]; weight, bias, and
//                                      the running statistics running_mean, running_var
//   group_norm {groups}                per example over groups of channels (the DP-friendly
//                                      normaliser); weight, bias [channels]
//   relu {}, tanh {}                   element-wise
//   dropout {rate}                     inverted dropout while training, identity in evaluation
//   flatten {}                         [c, h, w] -> [c * h * w]
//   scattering2d {scales, angles}      the 2-D scattering transform (kernels/scattering.h): fixed
//                                      wavelet features, no parameters; J = scales, L = angles
//                                      give [c * (1 + J L + L^2 J (J-1) / 2), h / 2^J, w / 2^J].
//                                      Only as the first layer (no gradient flows through it): a
//                                      workspace transforms its data once when it loads them.
// Shapes are checked when the spec is validated: every error names the layer (its index and
// kind) and the dimension that does not fit.
//
// MlpSpec is the shorthand `kind: mlp`: [dense, (batch_norm,) relu] per hidden width, then a dense
// output layer. A ModelSpec converts from it implicitly, with the MLP's parameter names and order
// of earlier releases, so MLP model files and checkpoints keep loading.
//
// An external model (ModelSpec::External) is one whose architecture is not in this layer set: a
// user's own PyTorch or C++ network, trained by the clients' own trainers (client SDK). Huddle
// knows only its tensors, a ModelLayout (names, shapes, float32) held in `tensors`; `input` and
// `layers` are empty. A non-empty `tensors` is what makes a spec external. The coordinator
// aggregates, clips, noises, checkpoints and writes such a model like any other (all of that only
// sees tensors), but nothing here can run it: InitModel gives no values (the initial model comes
// from the job's model file), input_dim() and num_classes() are 0, and every built-in training and
// evaluation entry point (Trainer::Create, TrainModel, TrainDpSgd, TrainUpdate, EvaluateModel,
// Evaluator::Create, CheckDpSgdModel, the datacenter trainer) refuses it with CheckBuiltIn's
// FailedPrecondition.
//
// Parameters live in a TensorList the caller owns, in Layout(spec) order: every layer's trainable
// tensors in layer order, named by kind and a per-kind counter (fc<k>.weight, fc<k>.bias for dense;
// conv<k>.*, bn<k>.weight/bias, gn<k>.weight/bias), then the running statistics
// bn<k>.running_mean and bn<k>.running_var of every batch norm, which are state, not trained by
// gradients: training updates them from each batch (momentum kBatchNormMomentum) and evaluation
// normalises with them. They travel with the model (files, federated updates, checkpoints) like
// the parameters.
//
// Determinism: InitModel is bitwise reproducible everywhere. TrainModel is bitwise reproducible
// for the same inputs and seed with the same build on the same CPU model and instruction set (the
// CPU kernels are single-threaded; Eigen sizes its GEMM blocks from the CPU's cache sizes, so the
// last bits can differ between CPU models). On a GPU (TrainOptions::backend) the same steps run in
// the same order; cuBLAS sums in another order, so results agree with the CPU to float rounding
// and are reproducible on the same GPU model and toolkit.
// Thread-safety: stateless functions. Concurrent calls are safe when they train different
// TensorLists on different backends; each call allocates its own buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/tensor.h"
#include "data/dataset.h"

namespace huddle::kernels {
class Backend;
}

namespace huddle::models {

// The `kind: mlp` shorthand.
struct MlpSpec {
  int64_t input_dim = 784;              // features per example
  std::vector<int64_t> hidden = {128};  // widths of the ReLU layers, input to output
  int64_t num_classes = 10;             // width of the output (logit) layer, >= 2
  bool batch_norm = false;              // batch normalization before each hidden ReLU
};

enum class LayerKind {
  kDense,
  kConv2d,
  kMaxPool2d,
  kAvgPool2d,
  kBatchNorm,
  kGroupNorm,
  kRelu,
  kTanh,
  kDropout,
  kFlatten,
  kScattering2d,
};

// Whether a layer of this kind has trainable parameters (dense, conv2d, batch_norm, group_norm:
// a weight and a bias each).
bool HasParameters(LayerKind kind);

// The config/wire name of a kind ("dense", "conv2d", "max_pool2d", ...), and back.
std::string LayerKindName(LayerKind kind);
StatusOr<LayerKind> ParseLayerKind(std::string_view name);

struct LayerSpec {
  LayerKind kind = LayerKind::kRelu;
  int64_t out = 0;      // dense: units; conv2d: output channels
  int64_t kernel = 0;   // conv2d, pools: side of the square window
  int64_t stride = 0;   // conv2d: 0 means 1; pools: 0 means kernel
  int64_t padding = 0;  // conv2d, pools: zeros added on every side
  int64_t groups = 0;   // group_norm: number of channel groups (divides the channels)
  double rate = 0;      // dropout: probability of zeroing an activation, in [0, 1)
  int64_t scales = 0;   // scattering2d: J, in [1, 4]
  int64_t angles = 0;   // scattering2d: L, in [1, 16]
  bool operator==(const LayerSpec&) const = default;

  int64_t effective_stride() const {
    return stride > 0 ? stride : kind == LayerKind::kConv2d ? 1 : kernel;
  }
};

// One option of a layer kind in a job's YAML (`- conv2d: {out: 32, kernel: 5}`), from the kind's
// file in models/layers/: the LayerSpec field it sets (`integer`, or `real` for a double), whether
// it must be given, its range [min, max], and the value the field takes when it is not given.
struct LayerOption {
  const char* key = "";
  int64_t LayerSpec::*integer = nullptr;
  double LayerSpec::*real = nullptr;
  bool required = false;
  double min = 0, max = 0;
  double absent = 0;  // optional options only (0: LayerSpec's default, e.g. stride = the window's)
};

// The options of `kind`, in the order a config reader checks them (none for relu, tanh, flatten
// and batch_norm). ValidateModelSpec applies the shape rules on top of these ranges.
std::span<const LayerOption> LayerOptions(LayerKind kind);

struct ModelSpec {
  std::vector<int64_t> input = {784};  // one example's shape: [features] or [c, h, w]
  std::vector<LayerSpec> layers;
  // External models only (see above): the model's tensors, in order. Empty for a layer list.
  ModelLayout tensors;
  bool operator==(const ModelSpec&) const = default;

  ModelSpec() = default;
  // The MLP shorthand (implicit: wherever a model is expected, an MlpSpec will do).
  ModelSpec(const MlpSpec& mlp);  // NOLINT(google-explicit-constructor)
  // An external model of these tensors (`input` and `layers` empty). ValidateModelSpec checks it.
  static ModelSpec External(ModelLayout tensors);

  // Whether only the model's tensors are known (Huddle's built-in trainers cannot run it).
  bool external() const { return !tensors.empty(); }
  // Product of `input`: the features per example the data must have (0 for an external model).
  int64_t input_dim() const;
  // Width of the last layer's output (0 when the spec does not validate, or is external).
  int64_t num_classes() const;
  // Whether some layer is a batch norm (DP-SGD refuses those).
  bool has_batch_norm() const;
};

// Batch normalization's constants (PyTorch's nn.BatchNorm1d/2d defaults), and group norm's eps.
inline constexpr double kBatchNormEps = 1e-5;
inline constexpr double kBatchNormMomentum = 0.1;
inline constexpr double kGroupNormEps = 1e-5;

// An external model's limits, set by what one wire message can carry (proto/codec.h: at most 256
// tensors of at most 2^28 elements each), with names short enough that the Welcome describing
// them always fits the codec's 64 KiB header.
inline constexpr size_t kMaxExternalTensors = 256;
inline constexpr size_t kMaxTensorNameBytes = 128;
inline constexpr int64_t kMaxExternalTensorElements = int64_t{1} << 28;

// Limits that keep layouts sane: input and every dimension in [1, 2^24], at most 256 layers, at
// most 2^31 parameters and 2^26 activations per example in total, a flat output of >= 2 values.
// The error names the layer (index and kind) and the dimension that does not fit, e.g.
// "model layer 6 (dense) needs a flat input; it gets [64, 7, 7]: add a flatten layer before it".
// An external spec: 1 to kMaxExternalTensors tensors with unique names of 1 to
// kMaxTensorNameBytes characters of [A-Za-z0-9_.:/-], dtype float32, shapes valid for ValidateShape
// (rank <= 8, every dimension >= 1, at most kMaxExternalTensorElements elements; a scalar's shape
// is []), at most 2^31 parameters in total, and no `input` or `layers`. The error names the tensor,
// e.g. "model tensor 3 ('layer1.0.conv1.weight'): shape [64,0,3,3] has a dimension < 1".
Status ValidateModelSpec(const ModelSpec& spec);

// OK for a model of Huddle's layer set; for an external spec the FailedPrecondition every built-in
// trainer and evaluator returns: "the model is external (only its tensors are known): Huddle's
// built-in trainers cannot train or evaluate it; clients bring their own trainer (client SDK)".
Status CheckBuiltIn(const ModelSpec& spec);

// Each layer's output shape for one example (layer i -> shapes[i]). Errors as ValidateModelSpec;
// CheckBuiltIn's error for an external spec (it has no layers).
StatusOr<std::vector<std::vector<int64_t>>> LayerShapes(const ModelSpec& spec);

// The MLP the spec is, when it is one (a spec that MlpSpec produces); for compact descriptions
// and the wire format older agents understand.
std::optional<MlpSpec> AsMlp(const ModelSpec& spec);

// For logs: "mlp 784-128-10" (with " (batch norm)") for an MLP, "external model: 8 tensors,
// 215,370 parameters" for an external one, otherwise e.g.
// "1x28x28 conv2d 32 k5 p2 > relu > max_pool2d k2 > flatten > dense 10 (1,234,567 parameters)".
std::string DescribeModel(const ModelSpec& spec);

// Names and shapes of the parameters (see above; an external spec's `tensors`). Precondition:
// ValidateModelSpec(spec).ok().
ModelLayout Layout(const ModelSpec& spec);

// The number of leading Layout tensors that gradients train (all but the running statistics; all
// of an external model's tensors, as far as Huddle can tell).
size_t NumTrainable(const ModelSpec& spec);

// Fresh parameters: the weights of a dense or conv2d layer uniform in [-b, b] with
// b = sqrt(6 / fan_in) when the next activation after it (past normalisation, pooling and
// dropout) is a ReLU (He/Kaiming uniform) and b = sqrt(3 / fan_in) otherwise (LeCun uniform: the
// output layer, tanh); biases zero; normalisation weights and running variances 1, their biases
// and running means 0. Tensor i draws from Rng(DeriveSeed(seed, i)). Returns an empty list for an
// invalid spec, and for an external one (there is no initialisation rule for an unknown network:
// its initial values come from a model file).
TensorList InitModel(const ModelSpec& spec, uint64_t seed);

// OK iff `params` matches Layout(spec) exactly (count, names, shapes, data sizes); otherwise an
// InvalidArgument naming the first mismatching tensor and both shapes.
Status CheckParams(const ModelSpec& spec, const TensorList& params);

struct TrainOptions {
  int64_t epochs = 1;            // passes over the data, >= 1
  int64_t batch_size = 32;       // examples per SGD step, >= 1; the last batch may be smaller
  double learning_rate = 0.05;   // > 0
  double momentum = 0.0;         // in [0, 1); 0 = plain SGD
  double weight_decay = 0.0;     // L2 coefficient, >= 0
  const Clock* clock = nullptr;  // times TrainStats::seconds; nullptr = SteadyClock
  // Where the arithmetic runs (kernels/backend.h; not owned). nullptr = a CPU backend made for the
  // call. On a GPU the model and the data are copied to the device once per call and back once.
  kernels::Backend* backend = nullptr;
};

// Averages over every example seen during training (loss and accuracy of each minibatch are taken
// before that minibatch's step, as is conventional).
struct TrainStats {
  double loss = 0;       // mean softmax cross-entropy (nats)
  double accuracy = 0;   // fraction of examples whose argmax was the label
  int64_t examples = 0;  // epochs * view size
  int64_t steps = 0;     // SGD steps taken
  double seconds = 0;    // wall time of the call
};

// Trains *params in place with minibatch SGD over `data` for options.epochs epochs. Each epoch
// visits the view's rows in an order shuffled by Rng(DeriveSeed(seed, epoch)); dropout draws from
// `seed` too. Subnormal floats are flushed to zero during the call (kernels/flush_denormals.h).
// Errors (InvalidArgument, *params untouched): invalid spec or options, params not matching the
// spec, an empty view, feature_dim != input_dim(), a label outside [0, num_classes()).
// If the loss becomes non-finite training stops at the end of that epoch (the running loss is read
// once per epoch, so the device never waits inside one) with FailedPrecondition ("diverged") and
// *params hold the diverged values; the caller should discard them. A device fault is returned as
// the backend reports it.
StatusOr<TrainStats> TrainModel(const ModelSpec& spec, const TrainOptions& options,
                                const data::DatasetView& data, uint64_t seed, TensorList* params);

struct EvalStats {
  double loss = 0;       // mean softmax cross-entropy (nats)
  double accuracy = 0;   // fraction of examples classified correctly
  int64_t examples = 0;  // view size
};

// Loss and accuracy of `params` on every row of `data`, in batches of batch_size (>= 1; affects
// only speed and memory). Errors as for TrainModel.
StatusOr<EvalStats> EvaluateModel(const ModelSpec& spec, const TensorList& params,
                                  const data::DatasetView& data, int64_t batch_size = 1000,
                                  kernels::Backend* backend = nullptr);

// EvaluateModel for many models on the same data (each round's or epoch's): the data are loaded
// once, with a scattering2d first layer's transform (about 0.7 ms an image) computed once.
// `data` (and `backend`, when given) must outlive the evaluator. Used by one thread at a time.
class Evaluator {
 public:
  // Errors as EvaluateModel's for the spec, the data and batch_size.
  static StatusOr<std::unique_ptr<Evaluator>> Create(const ModelSpec& spec,
                                                     const data::DatasetView& data,
                                                     int64_t batch_size = 1000,
                                                     kernels::Backend* backend = nullptr);
  ~Evaluator();
  // EvaluateModel(spec, params, data, ...): InvalidArgument when params do not match the spec.
  StatusOr<EvalStats> Evaluate(const TensorList& params);

 private:
  struct State;
  explicit Evaluator(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace huddle::models
