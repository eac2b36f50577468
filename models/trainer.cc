#include "models/trainer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/rng.h"
#include "models/internal/net_workspace.h"
#include "models/internal/train_loops.h"

namespace huddle::models {

using internal::NetWorkspace;

namespace {

// Dropout's stream of the training seed (the epochs' shuffles use streams 0, 1, ...).
constexpr uint64_t kDropoutStream = uint64_t{1} << 63;

}  // namespace

// SyncBatchNorm through the GradientSync: the statistics of the step's global batch.
class Trainer::BatchNormAdapter final : public NetWorkspace::BatchNormSync {
 public:
  explicit BatchNormAdapter(GradientSync& sync) : sync_(sync) {}
  void set_global_rows(int64_t rows) { rows_ = rows; }
  int64_t global_rows() const override { return rows_; }
  void AllReduceSum(double* sums, int64_t count) override {
    sync_.AllReduceBatchNormSums(sums, count);
  }

 private:
  GradientSync& sync_;
  int64_t rows_ = 1;
};

Trainer::Trainer(const TrainOptions& train, Loop loop, int64_t n)
    : train_(train),
      loop_(loop),
      n_(n),
      hyper_{static_cast<float>(train.learning_rate), static_cast<float>(train.momentum),
             static_cast<float>(train.weight_decay)},
      last_factor_(std::nanf("")) {}

Trainer::~Trainer() = default;

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const ModelSpec& spec, const TrainOptions& train,
                                                   const data::DatasetView& data, Loop loop) {
  HUDDLE_RETURN_IF_ERROR(CheckBuiltIn(spec));
  if (loop.world < 1 || loop.rank < 0 || loop.rank >= loop.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer rank ", loop.rank, " of a world of ", loop.world));
  }
  if (loop.world > 1 && loop.sync == nullptr) {
    return absl::InvalidArgumentError("a trainer of several ranks needs a GradientSync");
  }
  if (loop.global_batch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("global batch is ", loop.global_batch, "; it must be >= 0"));
  }
  HUDDLE_RETURN_IF_ERROR(ValidateModelSpec(spec));
  HUDDLE_RETURN_IF_ERROR(CheckData(spec, data));
  const int64_t n = data.size();
  std::unique_ptr<Trainer> t(new Trainer(train, loop, n));
  int64_t capacity = 0;
  internal::DpSgdPlan plan;
  if (loop.dp_sgd) {
    HUDDLE_ASSIGN_OR_RETURN(plan, internal::PlanDpSgd(spec, train, *loop.dp_sgd, n));
    capacity = plan.capacity;
    t->dp_steps_ = plan.steps;
  } else {
    HUDDLE_RETURN_IF_ERROR(CheckTrainOptions(train));
    t->global_batch_ = loop.global_batch > 0 ? loop.global_batch : train.batch_size;
    // The largest slice of a global batch.
    capacity = std::min((t->global_batch_ + loop.world - 1) / loop.world, n);
  }
  t->backend_ = &internal::BackendFor(train, &t->owned_backend_);
  t->train_.backend = t->backend_;
  HUDDLE_ASSIGN_OR_RETURN(t->ws_,
                          NetWorkspace::Create(*t->backend_, spec, std::max<int64_t>(capacity, 1),
                                               /*training=*/true));
  NetWorkspace& ws = *t->ws_;
  HUDDLE_RETURN_IF_ERROR(ws.LoadData(data));
  ws.set_dropout_seed(DeriveSeed(loop.seed, kDropoutStream));
  if (loop.world > 1) {
    HUDDLE_ASSIGN_OR_RETURN(t->factor_, t->backend_->Allocate(sizeof(float)));
    t->batch_norm_ = std::make_unique<BatchNormAdapter>(*loop.sync);
    ws.set_batch_norm_sync(t->batch_norm_.get());
  }
  if (loop.dp_sgd) {
    HUDDLE_ASSIGN_OR_RETURN(
        t->stepper_, internal::DpSgdStepper::Create(ws, plan, train, *loop.dp_sgd, loop.noise,
                                                    loop.rank, loop.world));
    if (loop.world > 1) {
      internal::DpSgdStepper& stepper = *t->stepper_;
      GradientSync& sync = *loop.sync;
      stepper.set_all_reduce([&stepper, &sync] {
        return sync.AllReduceUnits(
            std::span<int64_t>(stepper.units(), static_cast<size_t>(stepper.units_count())));
      });
    }
  }
  GradientLayout& layout = t->layout_;
  for (size_t i = 0; i < ws.num_trainable(); ++i) {
    layout.offsets.push_back(ws.param_offset(i));
    layout.sizes.push_back(ws.param_size(i));
  }
  for (size_t l = 0; l <= ws.num_layers(); ++l) layout.first_param.push_back(ws.first_param(l));
  layout.span = ws.trainable_span();
  return t;
}

Status Trainer::SetOrder(const std::vector<int64_t>& positions) { return ws_->SetOrder(positions); }

Status Trainer::SgdStep(int64_t begin, int64_t m) {
  HUDDLE_ASSIGN_OR_RETURN(const int64_t rows, Gradient(begin, m));
  HUDDLE_RETURN_IF_ERROR(ws_->Step(hyper_));
  ++steps_;
  examples_ += rows;
  return absl::OkStatus();
}

StatusOr<int64_t> Trainer::ComputeGradient(int64_t begin, int64_t rows) {
  if (loop_.world != 1 || loop_.sync != nullptr || loop_.dp_sgd) {
    return absl::FailedPreconditionError(
        "ComputeGradient needs a trainer of one rank, without a sync or DP-SGD");
  }
  if (begin < 0 || rows < 1 || rows > global_batch_ || begin + rows > n_) {
    return absl::InvalidArgumentError(absl::StrCat("ComputeGradient of rows [", begin, ", ",
                                                   begin + rows, ") of ", n_, " (batch ",
                                                   global_batch_, ")"));
  }
  HUDDLE_ASSIGN_OR_RETURN(const int64_t done, Gradient(begin, rows));
  examples_ += done;
  return done;
}

StatusOr<int64_t> Trainer::Gradient(int64_t begin, int64_t m) {
  NetWorkspace& ws = *ws_;
  const int rank = loop_.rank, world = loop_.world;
  GradientSync* sync = loop_.sync;
  // This rank's slice of the global batch [begin, begin + m).
  const int64_t lo = m * rank / world, hi = m * (rank + 1) / world;
  const int64_t rows = hi - lo;
  if (world > 1) {
    // The loss gradient of the slice's mean loss times rows / m is that of the mean loss over
    // the global batch (rows / m is exactly 1/world, a power of two for 2 or 4 ranks, when the
    // slices are equal), so the gradients' sum over ranks is the global batch's gradient, and
    // batch norm's backward pass sees the gradient of one global loss, as it must.
    const float f = static_cast<float>(static_cast<double>(rows) / static_cast<double>(m));
    if (f != last_factor_) {
      backend_->CopyToDevice(factor_.data(), &f, sizeof f);
      last_factor_ = f;
    }
    batch_norm_->set_global_rows(m);
  }
  if (sync != nullptr) sync->StartStep(m);
  // Dropout's masks follow the step count (a resume continues them) and each row's position in
  // the global batch (any number of ranks draws the same masks).
  ws.set_dropout_pass(static_cast<uint64_t>(steps_));
  ws.set_dropout_first_row(lo);
  // A batch-norm model's rank takes part in the statistics' all-reduces even with no rows.
  if (rows > 0 || ws.batch_norm()) {
    if (rows > 0) ws.Gather(begin + lo, rows);
    ws.Forward(rows, /*training=*/true);
    const size_t last = ws.num_layers() - 1;
    if (world > 1 && rows > 0) {
      backend_->ScaleRows(ws.layer_grad(last), 1, rows * ws.output_size(last), factor_.as<float>());
    }
    if (sync != nullptr && loop_.overlap) {
      ws.Backward(rows, [sync](size_t l) { sync->LayerDone(l); });
    } else {
      ws.Backward(rows);
      if (sync != nullptr) {
        for (size_t l = ws.num_layers(); l-- > 0;) sync->LayerDone(l);
      }
    }
  } else {
    // Fewer rows than ranks in the last batch: this rank contributes zeros.
    backend_->Zero(ws.grads_base(), ws.params_span() * static_cast<int64_t>(sizeof(float)));
    for (size_t l = ws.num_layers(); l-- > 0;) sync->LayerDone(l);
  }
  if (sync != nullptr) HUDDLE_RETURN_IF_ERROR(sync->FinishStep());
  return rows;
}

Status Trainer::TrainEpochs(int64_t first_epoch, int64_t first_row, const AfterStep& after_step,
                            const EndEpoch& end_epoch) {
  if (loop_.dp_sgd) return absl::FailedPreconditionError("TrainEpochs on a DP-SGD trainer");
  order_.resize(static_cast<size_t>(n_));
  for (int64_t epoch = first_epoch; epoch < train_.epochs; ++epoch) {
    epoch_ = epoch;
    std::iota(order_.begin(), order_.end(), int64_t{0});
    Rng rng(DeriveSeed(loop_.seed, static_cast<uint64_t>(epoch)));
    rng.Shuffle(order_);
    HUDDLE_RETURN_IF_ERROR(ws_->SetOrder(order_));
    ws_->ResetTotals();
    for (int64_t begin = epoch == first_epoch ? first_row : 0; begin < n_; begin += global_batch_) {
      const int64_t m = std::min(global_batch_, n_ - begin);
      HUDDLE_RETURN_IF_ERROR(SgdStep(begin, m));
      if (after_step) HUDDLE_RETURN_IF_ERROR(after_step(begin + m));
    }
    if (end_epoch) HUDDLE_RETURN_IF_ERROR(end_epoch(epoch, n_));
  }
  return absl::OkStatus();
}

StatusOr<int64_t> Trainer::DpSgdStep(const std::vector<int64_t>& sample, int64_t step) {
  if (stepper_ == nullptr) return absl::FailedPreconditionError("DpSgdStep without DP-SGD");
  HUDDLE_ASSIGN_OR_RETURN(const int64_t rows, stepper_->Step(sample, step));
  ++steps_;
  examples_ += rows;
  return rows;
}

Status Trainer::TrainDpSgd(int64_t first_step, privacy::NoiseSource& sampling,
                           const AfterStep& after_step, const EndEpoch& end_epoch) {
  if (stepper_ == nullptr) return absl::FailedPreconditionError("TrainDpSgd without DP-SGD");
  const int64_t m = loop_.dp_sgd->expected_batch_size;
  const int64_t steps_per_epoch = DpStepsPerEpoch();
  int64_t epoch = first_step / steps_per_epoch, epoch_rows = 0;
  std::vector<int64_t> sample;
  ws_->ResetTotals();
  for (int64_t step = first_step; step < dp_steps_; ++step) {
    epoch_ = epoch;
    SamplePoissonBatch(n_, m, sampling, &sample);
    HUDDLE_RETURN_IF_ERROR(DpSgdStep(sample, step).status());
    epoch_rows += static_cast<int64_t>(sample.size());
    if (after_step) HUDDLE_RETURN_IF_ERROR(after_step(epoch_rows));
    if ((step + 1) % steps_per_epoch == 0 || step + 1 == dp_steps_) {
      if (end_epoch) HUDDLE_RETURN_IF_ERROR(end_epoch(epoch, epoch_rows));
      ++epoch;
      epoch_rows = 0;
      ws_->ResetTotals();
    }
  }
  return absl::OkStatus();
}

int64_t Trainer::dp_steps() const { return dp_steps_; }

int64_t Trainer::DpStepsPerEpoch() const {
  const int64_t m = loop_.dp_sgd->expected_batch_size;
  return std::max<int64_t>(1, (n_ + m - 1) / m);
}

int64_t Trainer::epochs() const {
  if (!loop_.dp_sgd) return train_.epochs;
  const int64_t per_epoch = DpStepsPerEpoch();
  return (dp_steps_ + per_epoch - 1) / per_epoch;
}

std::array<unsigned char, 32> Trainer::DrawSamplingKey(privacy::NoiseSource& noise) {
  return internal::DrawSamplingKey(noise);
}

void Trainer::set_steps(int64_t steps) { steps_ = steps; }

StatusOr<kernels::LossAccumulator> Trainer::ReadTotals() { return ws_->ReadTotals(); }
void Trainer::ResetTotals() { ws_->ResetTotals(); }

void Trainer::UploadParams(const TensorList& params) { ws_->UploadParams(params); }
Status Trainer::DownloadParams(TensorList* params) { return ws_->DownloadParams(params); }
Status Trainer::DownloadVelocity(TensorList* velocity) { return ws_->DownloadVelocity(velocity); }
Status Trainer::UploadVelocity(const TensorList& velocity) { return ws_->UploadVelocity(velocity); }
Status Trainer::EnsureVelocity() { return ws_->EnsureVelocity(); }

std::span<float> Trainer::velocity(size_t i) const {
  float* v = ws_->velocity(i);
  return v == nullptr ? std::span<float>()
                      : std::span<float>(v, static_cast<size_t>(ws_->param_size(i)));
}

std::span<float> Trainer::params() const {
  return {ws_->params_base(), static_cast<size_t>(ws_->params_span())};
}

void Trainer::UnpackParams(const std::vector<float>& packed, TensorList* params) const {
  ws_->UnpackParams(packed, params);
}

std::span<float> Trainer::gradients() const {
  return {ws_->grads_base(), static_cast<size_t>(layout_.span)};
}

Status LossDiverged(int64_t epoch, double learning_rate) {
  return absl::FailedPreconditionError(absl::StrCat("training diverged: non-finite loss in epoch ",
                                                    epoch, " (learning_rate ", learning_rate,
                                                    " is probably too high)"));
}

Status CheckTrainOptions(const TrainOptions& o) {
  if (o.epochs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("epochs is ", o.epochs, "; it must be >= 1"));
  }
  if (o.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size is ", o.batch_size, "; it must be >= 1"));
  }
  if (!(o.learning_rate > 0.0 && std::isfinite(o.learning_rate))) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning_rate is ", o.learning_rate, "; it must be positive and finite"));
  }
  if (!(o.momentum >= 0.0 && o.momentum < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("momentum is ", o.momentum, "; it must be in [0, 1)"));
  }
  if (!(o.weight_decay >= 0.0 && std::isfinite(o.weight_decay))) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_decay is ", o.weight_decay, "; it must be finite and >= 0"));
  }
  return absl::OkStatus();
}

Status CheckModelAndData(const ModelSpec& spec, const TensorList& params,
                         const data::DatasetView& view) {
  HUDDLE_RETURN_IF_ERROR(CheckParams(spec, params));
  return CheckData(spec, view);
}

Status CheckData(const ModelSpec& spec, const data::DatasetView& view) {
  HUDDLE_RETURN_IF_ERROR(data::ValidateView(view));
  const data::Dataset& base = *view.base;
  if (base.feature_dim != spec.input_dim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the data has ", base.feature_dim, " features per example but the model's input ",
        ShapeString(spec.input), " has ", spec.input_dim()));
  }
  if (base.features.size() != static_cast<size_t>(base.size() * base.feature_dim)) {
    return absl::InvalidArgumentError(absl::StrCat("the data has ", base.features.size(),
                                                   " feature values for ", base.size(),
                                                   " examples of ", base.feature_dim));
  }
  if (view.size() == 0) return absl::InvalidArgumentError("the data has no examples");
  const int64_t num_classes = spec.num_classes();
  for (int64_t i = 0; i < view.size(); ++i) {
    const int32_t label = base.labels[static_cast<size_t>(view.row(i))];
    if (label < 0 || label >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat("example ", view.row(i), " has label ", label,
                                                     ", outside the model's [0, ", num_classes,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace huddle::models
