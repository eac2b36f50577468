// Huddle client SDK: the trainer interface. Public, installed; depends on the C++ standard library
// alone.
//
// A Trainer is the local training code of one federated client: Huddle's built-in trainers (the
// models of a job's `model:` layer list), a user's C++ class, or a Python object through the
// binding all implement it, and the client agent drives each of them the same way:
//
//   Start(job)                 once per job the client joins: check that this trainer can train
//                              the job's model (its tensors' names and shapes)
//   Fit(global, config)        each round: train from the round's global model on local data and
//                              return the local model (or local - global), the example count and
//                              metrics
//   Evaluate(model, config)    optional (federated evaluation): the loss and accuracy of a model
//                              on local data
//
// Huddle does everything after Fit returns, whatever the trainer: it checks the result's names,
// shapes and values, forms delta = local - global, clips it to the round's norm, adds local DP
// noise where the job or the client's privacy policy asks, accounts the release in the client's
// ledger, and sends it over the encrypted connection. So the privacy guarantees never depend on the
// trainer's code, with one exception that the trainer states itself: a trainer that runs DP-SGD on
// its examples (FitConfig::dp_sgd) reports what it ran (FitResult::dp_sgd) and the agent accounts
// that, refusing to send an update whose report is missing or spends more than the round allowed.
//
// Errors: a trainer fails a call by throwing (any std::exception; its what() is logged and sent
// to the coordinator). A failed Fit or Evaluate fails that round for this client only; a failed
// Start refuses the job and ends the client.
//
// Thread-safety: the agent calls a trainer from one thread at a time (not always the same one).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace huddle::client {

// A float32 tensor in row-major order: shape's product values (a scalar has shape []).
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};
using NamedTensors = std::vector<NamedTensor>;

// The name and shape of one of the model's tensors.
struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
};

// The job a client joined.
struct JobInfo {
  std::string name;
  // The model's tensors, in the order the global model is given and a result must be returned.
  std::vector<TensorInfo> tensors;
  // "layers" or "mlp": a model of Huddle's layer set (built-in trainers train it; a user trainer
  // may train any network with these tensors); "external": the job knows only the tensors.
  std::string model_kind;
};

// Example-level DP-SGD that the round asks the trainer to run on its examples: Poisson-sampled
// batches of expected size expected_batch_size, each example's gradient clipped to clip_norm,
// Gaussian noise of standard deviation noise_multiplier * clip_norm added to each step's sum.
struct DpSgdConfig {
  double noise_multiplier = 0;
  double clip_norm = 0;
  int64_t expected_batch_size = 0;
  double delta = 0;  // the delta the client reports its epsilon at
};

// One round's training settings, as the job configures them (`train:`).
struct FitConfig {
  uint64_t round = 0;
  uint64_t seed = 0;  // this client's seed for the round (shuffling, dropout): reproducible runs
  int64_t epochs = 1;
  int64_t batch_size = 32;
  double learning_rate = 0.1;
  double momentum = 0;
  double weight_decay = 0;
  std::optional<DpSgdConfig> dp_sgd;  // set: the round must train with DP-SGD (see DpSgdReport)
};

// What a DP-SGD run spent: `steps` steps of the sampled Gaussian mechanism, each on a Poisson
// sample of the examples with probability sampling_rate, noise std noise_multiplier * clip_norm.
// It must be no more than the round allowed: noise_multiplier >= the config's, sampling_rate <=
// expected_batch_size / the examples trained on, steps <= round(epochs / sampling_rate).
struct DpSgdReport {
  double noise_multiplier = 0;
  double sampling_rate = 0;
  int64_t steps = 0;
};

struct FitResult {
  // The tensors of JobInfo::tensors, same names, shapes and order: the local model after
  // training, or local - global when is_delta.
  NamedTensors tensors;
  bool is_delta = false;
  // The examples trained on (the federated average's weight); >= 1.
  int64_t num_examples = 0;
  // Training metrics, reported to the coordinator when no privacy setting forbids it: "loss" and
  // "accuracy" are the job's train_loss and train_accuracy.
  std::map<std::string, double> metrics;
  // Required when FitConfig::dp_sgd is set.
  std::optional<DpSgdReport> dp_sgd;
};

struct EvaluateResult {
  int64_t num_examples = 0;
  double loss = 0;
  double accuracy = 0;
};

class Trainer {
 public:
  virtual ~Trainer() = default;

  // The number of local examples (the client's Join reports it unless a privacy policy hides it).
  virtual int64_t num_examples() const = 0;
  // Called when the client joins a job, before its first round. Throw to refuse the job (e.g. the
  // tensors are not this trainer's network).
  virtual void Start(const JobInfo& job) { (void)job; }
  // Trains from `global` (JobInfo::tensors, in order) as `config` says.
  virtual FitResult Fit(const NamedTensors& global, const FitConfig& config) = 0;
  // Whether Evaluate is implemented (federated evaluation asks only trainers that can).
  virtual bool can_evaluate() const { return false; }
  virtual EvaluateResult Evaluate(const NamedTensors& model) {
    (void)model;
    return {};
  }
};

}  // namespace huddle::client
