// Multi-layer perceptron classifier: spec, parameter layout, initialisation, training, evaluation.
//
// The model is  x -> [Dense -> (BatchNorm) -> ReLU] x len(hidden) -> Dense -> logits,  trained
// with softmax cross-entropy by minibatch SGD. It is the readable CPU trainer every client runs;
// all arithmetic goes through kernels/, where faster backends plug in.
//
// Parameters live in a TensorList the caller owns, in MlpLayout order:
//   fc0.weight [hidden[0], input_dim], fc0.bias [hidden[0]], fc1.weight [hidden[1], hidden[0]], ...
//   fc<L>.weight [num_classes, hidden[L-1]], fc<L>.bias [num_classes]
// (L = hidden.size(); with no hidden layers the model is multinomial logistic regression.)
// With batch_norm, each hidden layer l also has bn<l>.weight (gamma) and bn<l>.bias (beta)
// [hidden[l]] right after fc<l>.bias, and the list ends with the running statistics
// bn<l>.running_mean and bn<l>.running_var [hidden[l]] of every hidden layer, which are state,
// not trained by gradients: training updates them from each batch (kernels/batch_norm.h, momentum
// kBatchNormMomentum) and evaluation normalises with them. They travel with the model (files,
// federated updates, checkpoints) like the parameters. fc<l>.bias is redundant before a batch
// norm (its gradient is about zero) and kept so that every dense layer has the same layout.
//
// Determinism: InitMlp is bitwise reproducible everywhere. TrainMlp is bitwise reproducible for
// the same inputs and seed with the same build on the same CPU model (the CPU kernels are
// single-threaded; Eigen sizes its GEMM blocks from the CPU's cache sizes, so the last bits can
// differ between CPU models). On a GPU (TrainOptions::backend) the same steps run in the same
// order; cuBLAS sums in another order, so results agree with the CPU to float rounding and are
// reproducible on the same GPU model and toolkit.
// Thread-safety: stateless functions. Concurrent calls are safe when they train different
// TensorLists on different backends; each call allocates its own buffers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/tensor.h"
#include "data/dataset.h"

namespace huddle::kernels {
class Backend;
}

namespace huddle::models {

struct MlpSpec {
  int64_t input_dim = 784;              // features per example
  std::vector<int64_t> hidden = {128};  // widths of the ReLU layers, input to output
  int64_t num_classes = 10;             // width of the output (logit) layer, >= 2
  bool batch_norm = false;              // batch normalization before each hidden ReLU
};

// Batch normalization's constants (PyTorch's nn.BatchNorm1d defaults).
inline constexpr double kBatchNormEps = 1e-5;
inline constexpr double kBatchNormMomentum = 0.1;

// The number of leading MlpLayout tensors that gradients train (all but the running statistics).
size_t NumTrainable(const MlpSpec& spec);

// Limits that keep layouts sane: every width in [1, 2^24] (num_classes >= 2), at most 64 hidden
// layers, at most 2^31 parameters in total. The error names the offending field.
Status ValidateMlpSpec(const MlpSpec& spec);

// For logs: "mlp 784-128-10", with " (batch norm)" when it has.
std::string DescribeMlp(const MlpSpec& spec);

// Names and shapes of the parameters (see above). Precondition: ValidateMlpSpec(spec).ok().
ModelLayout MlpLayout(const MlpSpec& spec);

// Fresh parameters: weights uniform in [-b, b] with b = sqrt(6 / fan_in) for layers followed by a
// ReLU (He/Kaiming uniform) and b = sqrt(3 / fan_in) for the output layer (LeCun uniform); biases
// zero; batch norm's gamma and running variance 1, beta and running mean 0. Tensor i draws from
// Rng(DeriveSeed(seed, i)). Returns an empty list for an invalid spec.
TensorList InitMlp(const MlpSpec& spec, uint64_t seed);

// OK iff `params` matches MlpLayout(spec) exactly (count, names, shapes, data sizes); otherwise an
// InvalidArgument naming the first mismatching tensor and both shapes.
Status CheckParams(const MlpSpec& spec, const TensorList& params);

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
// visits the view's rows in an order shuffled by Rng(DeriveSeed(seed, epoch)). Subnormal floats are
// flushed to zero during the call (kernels/flush_denormals.h).
// Errors (InvalidArgument, *params untouched): invalid spec or options, params not matching the
// spec, an empty view, feature_dim != input_dim, a label outside [0, num_classes).
// If the loss becomes non-finite training stops at the end of that epoch (the running loss is read
// once per epoch, so the device never waits inside one) with FailedPrecondition ("diverged") and
// *params hold the diverged values; the caller should discard them. A device fault is returned as
// the backend reports it.
StatusOr<TrainStats> TrainMlp(const MlpSpec& spec, const TrainOptions& options,
                              const data::DatasetView& data, uint64_t seed, TensorList* params);

struct EvalStats {
  double loss = 0;       // mean softmax cross-entropy (nats)
  double accuracy = 0;   // fraction of examples classified correctly
  int64_t examples = 0;  // view size
};

// Loss and accuracy of `params` on every row of `data`, in batches of batch_size (>= 1; affects
// only speed and memory). Errors as for TrainMlp.
StatusOr<EvalStats> EvaluateMlp(const MlpSpec& spec, const TensorList& params,
                                const data::DatasetView& data, int64_t batch_size = 1000,
                                kernels::Backend* backend = nullptr);

}  // namespace huddle::models
