#include "client/secagg_member.h"

#include <algorithm>
#include <memory>

#include "aggregation/secagg/graph.h"
#include "aggregation/secagg/quantize.h"
#include "aggregation/secagg/wire.h"

namespace huddle::client {

namespace secagg = aggregation::secagg;

StatusOr<int64_t> SecAggMember::PlannedHonestShares(const wire::SecureAggregation& instruction,
                                                    const secagg::MemberPolicy& policy) {
  const int64_t n = instruction.members;
  return secagg::HonestShares(n, instruction.edge_threshold,
                              static_cast<int>(instruction.threshold),
                              secagg::Colluders(policy.corrupt_fraction, n),
                              instruction.min_survivors, policy.security_bits);
}

StatusOr<SecAggMember> SecAggMember::Create(const wire::SecureAggregation& instruction,
                                            const std::string& nonce, const TensorList& update,
                                            int64_t examples, privacy::NoiseSource& noise,
                                            const SecAggIdentity& identity) {
  HUDDLE_ASSIGN_OR_RETURN(secagg::SessionConfig config, secagg::SessionFromWire(instruction));
  HUDDLE_ASSIGN_OR_RETURN(secagg::Client client,
                          secagg::Client::Create(config, instruction.index, identity.id,
                                                 identity.key, identity.policy));
  const int64_t values = TotalElements(LayoutOf(update));
  const bool weighted = instruction.weight_cap > 0;
  if (config.length != static_cast<uint64_t>(values) + (weighted ? 1 : 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "secure aggregation: the round's masked input has ", config.length,
        " words; this model has ", values, " values", weighted ? " and a weight word" : ""));
  }
  // FedAvg's weight, capped; the update is scaled by it so that its norm stays within the clip.
  const uint64_t weight =
      weighted ? std::min<uint64_t>(static_cast<uint64_t>(std::max<int64_t>(examples, 1)),
                                    instruction.weight_cap)
               : 1;
  const double factor =
      weighted ? static_cast<double>(weight) / static_cast<double>(instruction.weight_cap) : 1.0;
  std::vector<uint64_t> input(config.length, 0);
  std::vector<float> scaled;
  auto random = [&noise] { return noise.NextU64(); };
  size_t at = 0;
  for (const Tensor& t : update) {
    std::span<const float> x = t.data;
    if (weighted) {
      scaled.resize(t.data.size());
      for (size_t i = 0; i < scaled.size(); ++i) {
        scaled[i] = static_cast<float>(static_cast<double>(t.data[i]) * factor);
      }
      x = scaled;
    }
    Status st = secagg::Quantize(x, instruction.scale_exponent, static_cast<int>(instruction.bits),
                                 random, std::span<uint64_t>(input).subspan(at, x.size()));
    if (!st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure aggregation: tensor '", t.name(), "': ", st.message()));
    }
    at += x.size();
  }
  if (instruction.noise_variance > 0) {
    // Distributed DP: this client's share of the round's noise, on the integer grid.
    HUDDLE_ASSIGN_OR_RETURN(privacy::DiscreteGaussian gaussian,
                            privacy::DiscreteGaussian::Create(instruction.noise_variance));
    std::vector<int64_t> k(static_cast<size_t>(values));
    for (int64_t& v : k) v = gaussian.Sample(noise);
    secagg::AddSigned(k, static_cast<int>(instruction.bits),
                      std::span<uint64_t>(input).first(static_cast<size_t>(values)));
  }
  if (weighted) input.back() = weight;
  return SecAggMember(std::move(client), nonce, std::move(input),
                      static_cast<int>(instruction.bits));
}

wire::Message SecAggMember::Advertise(uint64_t round, const std::string& sender) const {
  return secagg::ToMessage(client_.Advertise(), round, sender, nonce_);
}

StatusOr<std::vector<wire::Message>> SecAggMember::OnMessage(const wire::Message& msg,
                                                             const std::string& sender) {
  const auto& data = std::get<wire::SecAggData>(msg.body);
  if (!secagg::IsStage(data.stage) || secagg::FromMember(data.stage)) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: stage ", data.stage, " is not the coordinator's"));
  }
  HUDDLE_ASSIGN_OR_RETURN(std::span<const std::byte> bytes, secagg::PayloadOf(msg));
  const uint64_t round = msg.round;
  std::vector<wire::Message> out;
  auto reply = [&](const auto& m) { out.push_back(secagg::ToMessage(m, round, sender, nonce_)); };
  switch (static_cast<secagg::Stage>(data.stage)) {
    case secagg::Stage::kMemberList: {
      HUDDLE_ASSIGN_OR_RETURN(auto list, secagg::Decode<secagg::MemberList>(bytes));
      HUDDLE_ASSIGN_OR_RETURN(auto reveal, client_.OnMemberList(list));
      reply(reveal);
      break;
    }
    case secagg::Stage::kSeeds: {
      HUDDLE_ASSIGN_OR_RETURN(auto seeds, secagg::Decode<secagg::SeedList>(bytes));
      HUDDLE_ASSIGN_OR_RETURN(auto shares, client_.OnSeeds(seeds));
      reply(shares);
      break;
    }
    case secagg::Stage::kShareList: {
      HUDDLE_ASSIGN_OR_RETURN(auto list, secagg::Decode<secagg::ShareList>(bytes));
      HUDDLE_ASSIGN_OR_RETURN(auto verdict, client_.OnShareList(list));
      reply(verdict);
      break;
    }
    case secagg::Stage::kMask: {
      HUDDLE_ASSIGN_OR_RETURN(auto request, secagg::Decode<secagg::MaskRequest>(bytes));
      HUDDLE_ASSIGN_OR_RETURN(masked_, client_.MaskInput(request, input_));
      std::fill(input_.begin(), input_.end(), 0);  // the unmasked input is no longer needed
      break;
    }
    case secagg::Stage::kSurvivors: {
      HUDDLE_ASSIGN_OR_RETURN(auto sets, secagg::Decode<secagg::Survivors>(bytes));
      HUDDLE_ASSIGN_OR_RETURN(auto consistency, client_.OnSurvivors(sets));
      reply(consistency);
      break;
    }
    case secagg::Stage::kUnmask: {
      HUDDLE_ASSIGN_OR_RETURN(auto request, secagg::Decode<secagg::UnmaskRequest>(bytes));
      HUDDLE_ASSIGN_OR_RETURN(auto response, client_.OnUnmask(request));
      reply(response);
      done_ = true;
      break;
    }
    default:
      break;
  }
  return out;
}

wire::Message SecAggMember::MaskedInput(uint64_t round, uint64_t model_version,
                                        const std::string& sender,
                                        const ModelLayout& layout) const {
  wire::Message msg =
      wire::MakeMessage(wire::SecAggMaskedInput{nonce_, model_version}, round, sender);
  // One buffer of the words at the wire's width; each tensor payload a view into it.
  std::shared_ptr<const void> owner;
  const std::byte* bytes = nullptr;
  size_t word_bytes = 0;
  if (bits_ == 32) {
    auto words = std::make_shared<std::vector<uint32_t>>(masked_.begin(), masked_.end());
    bytes = reinterpret_cast<const std::byte*>(words->data());
    word_bytes = 4;
    owner = std::move(words);
  } else {
    auto words = std::make_shared<std::vector<uint64_t>>(masked_);
    bytes = reinterpret_cast<const std::byte*>(words->data());
    word_bytes = 8;
    owner = std::move(words);
  }
  const DType dtype = bits_ == 32 ? DType::kUint32 : DType::kUint64;
  size_t at = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, size_t count) {
    wire::TensorPayload p;
    p.spec = TensorSpec{name, dtype, std::move(shape)};
    p.owner = owner;
    p.bytes = std::span<const std::byte>(bytes + at * word_bytes, count * word_bytes);
    msg.tensors.push_back(std::move(p));
    at += count;
  };
  for (const TensorSpec& spec : layout) {
    add(spec.name, spec.shape, static_cast<size_t>(spec.NumElements()));
  }
  if (at < masked_.size()) add(kWeightName, {1}, 1);
  return msg;
}

}  // namespace huddle::client
