// The agreements of TrainDataParallel's ranks (internal/agreement.h).
#include "datacenter/internal/agreement.h"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

namespace huddle::datacenter::internal {

StatusOr<Scratch> Scratch::Create(kernels::Backend& backend, int world_size) {
  Scratch s(backend);
  HUDDLE_ASSIGN_OR_RETURN(s.buffer_, backend.Allocate(64 * (world_size + 1)));
  return s;
}

Status Scratch::AllReduceSum(Collective& c, std::span<double> values) {
  const int64_t bytes = static_cast<int64_t>(values.size_bytes());
  backend_->CopyToDevice(buffer_.data(), values.data(), bytes);
  HUDDLE_RETURN_IF_ERROR(backend_->Synchronize());
  HUDDLE_RETURN_IF_ERROR(c.AllReduceSum(std::span<double>(buffer_.as<double>(), values.size())));
  return backend_->CopyToHost(values.data(), buffer_.data(), bytes);
}

Status Scratch::Broadcast(Collective& c, std::span<std::byte> data, int root) {
  const auto bytes = static_cast<int64_t>(data.size());
  backend_->CopyToDevice(buffer_.data(), data.data(), bytes);
  HUDDLE_RETURN_IF_ERROR(backend_->Synchronize());
  HUDDLE_RETURN_IF_ERROR(
      c.Broadcast(std::span<std::byte>(buffer_.as<std::byte>(), data.size()), root));
  return backend_->CopyToHost(data.data(), buffer_.data(), bytes);
}

Status Scratch::AllGather(Collective& c, std::span<const std::byte> in, std::span<std::byte> out) {
  const auto bytes = static_cast<int64_t>(in.size());
  auto* device = buffer_.as<std::byte>();
  backend_->CopyToDevice(device, in.data(), bytes);
  HUDDLE_RETURN_IF_ERROR(backend_->Synchronize());
  HUDDLE_RETURN_IF_ERROR(c.AllGather(std::span<const std::byte>(device, in.size()),
                                     std::span<std::byte>(device + 64, out.size())));
  return backend_->CopyToHost(out.data(), device + 64, static_cast<int64_t>(out.size()));
}

namespace {

constexpr size_t kDigestBytes = 16;
using Digest = std::array<std::byte, kDigestBytes>;

// The ranks whose digest differs from rank 0's (all-gathered).
StatusOr<std::vector<int>> RanksDiffering(Collective& c, Scratch& scratch, const Digest& digest) {
  std::vector<std::byte> all(kDigestBytes * static_cast<size_t>(c.world_size()));
  HUDDLE_RETURN_IF_ERROR(scratch.AllGather(c, digest, all));
  std::vector<int> differ;
  for (int r = 1; r < c.world_size(); ++r) {
    if (std::memcmp(all.data() + r * kDigestBytes, all.data(), kDigestBytes) != 0) {
      differ.push_back(r);
    }
  }
  return differ;
}

// What every rank must agree on before the first step: the model and the options that shape the
// trajectory or the order of collectives.
Digest ConfigDigest(const models::ModelSpec& spec, const DataParallelOptions& o) {
  crypto_generichash_state h;
  crypto_generichash_init(&h, nullptr, 0, kDigestBytes);
  auto add = [&](const auto& v) {
    crypto_generichash_update(&h, reinterpret_cast<const unsigned char*>(&v), sizeof v);
  };
  for (int64_t d : spec.input) add(d);
  add(spec.input.size());
  for (const models::LayerSpec& l : spec.layers) {
    add(l.kind);
    add(l.out);
    add(l.kernel);
    add(l.stride);
    add(l.padding);
    add(l.groups);
    add(l.rate);
    add(l.scales);
    add(l.angles);
  }
  add(spec.layers.size());
  add(o.train.epochs);
  add(o.train.batch_size);
  add(o.train.learning_rate);
  add(o.train.momentum);
  add(o.train.weight_decay);
  add(o.seed);
  add(o.global_batch_size);
  add(o.bucket_bytes);
  add(o.first_bucket_bytes);
  add(o.checksum_every);
  add(o.stop_check_every);
  if (o.dp_sgd) {
    add(o.dp_sgd->dp.noise_multiplier);
    add(o.dp_sgd->dp.clip_norm);
    add(o.dp_sgd->dp.expected_batch_size);
  } else {
    add(int64_t{-1});
  }
  Digest d;
  crypto_generichash_final(&h, reinterpret_cast<unsigned char*>(d.data()), d.size());
  return d;
}

// The data itself, in the view's order: its size and shape, then each example's features (their
// bytes) and label. A rank with poisoned data of the right shape differs here.
Digest DataDigest(const data::DatasetView& data) {
  crypto_generichash_state h;
  crypto_generichash_init(&h, nullptr, 0, kDigestBytes);
  auto add = [&](const void* p, size_t bytes) {
    crypto_generichash_update(&h, static_cast<const unsigned char*>(p), bytes);
  };
  const int64_t n = data.size();
  const int64_t dim = n > 0 ? data.base->feature_dim : 0;
  add(&n, sizeof n);
  add(&dim, sizeof dim);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = data.row(i);
    add(data.base->row_features(row), static_cast<size_t>(dim) * sizeof(float));
    add(&data.base->labels[static_cast<size_t>(row)], sizeof(int32_t));
  }
  Digest d;
  crypto_generichash_final(&h, reinterpret_cast<unsigned char*>(d.data()), d.size());
  return d;
}

}  // namespace

Status CheckAgreement(Collective& c, Scratch& scratch, const models::ModelSpec& spec,
                      const DataParallelOptions& o, const data::DatasetView& data) {
  std::array<std::byte, 2 * kDigestBytes> mine;
  const Digest config = ConfigDigest(spec, o), values = DataDigest(data);
  std::memcpy(mine.data(), config.data(), kDigestBytes);
  std::memcpy(mine.data() + kDigestBytes, values.data(), kDigestBytes);
  std::vector<std::byte> all(mine.size() * static_cast<size_t>(c.world_size()));
  HUDDLE_RETURN_IF_ERROR(scratch.AllGather(c, mine, all));
  std::vector<int> other_config, other_data;
  for (int r = 1; r < c.world_size(); ++r) {
    const std::byte* theirs = all.data() + static_cast<size_t>(r) * mine.size();
    if (std::memcmp(theirs, all.data(), kDigestBytes) != 0) other_config.push_back(r);
    if (std::memcmp(theirs + kDigestBytes, all.data() + kDigestBytes, kDigestBytes) != 0) {
      other_data.push_back(r);
    }
  }
  if (!other_config.empty()) {
    return absl::FailedPreconditionError(fmt::format(
        "rank(s) {} have a different model, training options or seed than rank 0; every rank "
        "must run the same configuration",
        fmt::join(other_config, ", ")));
  }
  if (!other_data.empty()) {
    return absl::FailedPreconditionError(fmt::format(
        "rank(s) {} hold different training data than rank 0 (the digest of every example's "
        "features and label differs); every rank must load the same data",
        fmt::join(other_data, ", ")));
  }
  return absl::OkStatus();
}

StatusOr<StopVote> StopVote::Create(Collective& c, kernels::Backend& backend,
                                    const DataParallelOptions& o) {
  StopVote v;
  v.flag_ = o.stop;
  v.every_ = std::max<int64_t>(1, o.stop_check_every);
  v.backend_ = &backend;
  if (v.flag_ != nullptr && c.world_size() > 1) {
    HUDDLE_ASSIGN_OR_RETURN(v.buffer_, backend.Allocate(sizeof(double)));
    HUDDLE_ASSIGN_OR_RETURN(v.reduce_,
                            c.PrepareAllReduceSum(std::span<double>(v.buffer_.as<double>(), 1)));
  }
  return v;
}

StatusOr<bool> StopVote::StopAfter(int64_t steps) {
  if (flag_ == nullptr || steps % every_ != 0) return false;
  const double mine = flag_->load() ? 1.0 : 0.0;
  if (reduce_ == nullptr) return mine > 0;
  double sum = 0;
  backend_->CopyToDevice(buffer_.data(), &mine, sizeof mine);
  HUDDLE_RETURN_IF_ERROR(backend_->Synchronize());
  HUDDLE_RETURN_IF_ERROR(reduce_->Run());
  HUDDLE_RETURN_IF_ERROR(backend_->CopyToHost(&sum, buffer_.data(), sizeof sum));
  return sum > 0;
}

Status CheckReplicas(Collective& c, models::Trainer& trainer, Scratch& scratch, int64_t step) {
  const std::span<float> params = trainer.params();
  std::vector<float> host(params.size());
  HUDDLE_RETURN_IF_ERROR(trainer.backend().CopyToHost(host.data(), params.data(),
                                                      static_cast<int64_t>(params.size_bytes())));
  Digest digest;
  crypto_generichash(reinterpret_cast<unsigned char*>(digest.data()), digest.size(),
                     reinterpret_cast<const unsigned char*>(host.data()),
                     host.size() * sizeof(float), nullptr, 0);
  HUDDLE_ASSIGN_OR_RETURN(const std::vector<int> differ, RanksDiffering(c, scratch, digest));
  if (differ.empty()) return absl::OkStatus();
  return absl::DataLossError(fmt::format(
      "replicas diverged at step {}: the parameters of rank(s) {} differ from rank 0's (checked "
      "on rank {}); stopping rather than train inconsistent models",
      step, fmt::join(differ, ", "), c.rank()));
}

StatusOr<ResumeHeader> ShareResume(Collective& c, Scratch& scratch, models::Trainer& trainer,
                                   const DataParallelOptions& options, int64_t n, const Status& fit,
                                   Status* refusal) {
  static_assert(sizeof(ResumeHeader) <= 64, "Scratch::Broadcast moves at most 64 bytes");
  ResumeHeader h;
  if (c.rank() == 0 && options.resume != nullptr) {
    const TrainingState& state = *options.resume;
    if (!fit.ok()) {
      *refusal = fit;
    } else if (state.dp_sgd != options.dp_sgd.has_value()) {
      *refusal = absl::FailedPreconditionError(
          state.dp_sgd ? "the checkpoint was written by a DP-SGD run; this run is not DP-SGD"
                       : "the checkpoint was written without DP-SGD; this run uses DP-SGD");
    } else if (state.seed != options.seed) {
      *refusal = absl::FailedPreconditionError(
          fmt::format("the checkpoint was written with seed {}, this run has seed {}: resuming "
                      "would not continue the same run",
                      state.seed, options.seed));
    } else if (state.epochs_done < 0 || state.steps < 0) {
      *refusal = absl::DataLossError("the checkpoint's position is negative");
    } else if (state.epoch_rows < 0 || state.epoch_rows > n ||
               (state.dp_sgd && state.epoch_rows != 0)) {
      *refusal = absl::FailedPreconditionError(
          fmt::format("the checkpoint stopped {} rows into an epoch; this data set has {} rows",
                      state.epoch_rows, n));
    } else {
      *refusal = trainer.UploadVelocity(state.velocity);
    }
    h.refused = refusal->ok() ? 0 : 1;
    h.epochs_done = state.epochs_done;
    h.steps = state.steps;
    h.has_velocity = state.velocity.empty() ? 0 : 1;
    h.seconds = state.seconds;
    h.epoch_rows = state.epoch_rows;
  }
  HUDDLE_RETURN_IF_ERROR(
      scratch.Broadcast(c, std::as_writable_bytes(std::span<ResumeHeader>(&h, 1)), /*root=*/0));
  if (h.refused != 0) {
    if (c.rank() == 0) return *refusal;
    return absl::FailedPreconditionError(
        "rank 0 refused to resume from its checkpoint (its log says why)");
  }
  if (h.has_velocity != 0) {
    HUDDLE_RETURN_IF_ERROR(trainer.EnsureVelocity());
    HUDDLE_RETURN_IF_ERROR(trainer.backend().Synchronize());
    for (size_t i = 0; i < trainer.layout().sizes.size(); ++i) {
      HUDDLE_RETURN_IF_ERROR(c.Broadcast(std::as_writable_bytes(trainer.velocity(i)), 0));
    }
  }
  return h;
}

StatusOr<privacy::NoiseSource> ShareSamplingStream(Collective& c, Scratch& scratch,
                                                   privacy::NoiseSource* noise,
                                                   bool* private_noise) {
  struct {
    std::array<unsigned char, 32> key;
    int64_t is_private;
  } shared{};
  if (c.rank() == 0) {
    shared.key = models::Trainer::DrawSamplingKey(*noise);
    shared.is_private = noise->is_private() ? 1 : 0;
  }
  HUDDLE_RETURN_IF_ERROR(
      scratch.Broadcast(c, std::as_writable_bytes(std::span(&shared, 1)), /*root=*/0));
  privacy::NoiseSource sampling =
      privacy::NoiseSource::FromSharedKey(shared.key, shared.is_private != 0);
  std::fill(shared.key.begin(), shared.key.end(), 0);
  *private_noise = shared.is_private != 0;
  return sampling;
}

}  // namespace huddle::datacenter::internal
