// The members' messages of a round's secure aggregation (secure_round.h): each stage's answer
// checked against the stage and the member's latest instruction, decoded and handed to the
// session; a masked input checked against the round's layout and the session's word width.
#include <cstring>

#include "coordinator/secure_round.h"

namespace huddle::coordinator {

namespace secagg = aggregation::secagg;

namespace {

constexpr const char* kWeightName = "secagg.weight";  // client/secagg_member.h

}  // namespace

Status SecureRound::OnMessage(const std::string& id, const wire::Message& msg,
                              const std::string& nonce, uint64_t model_version) {
  if (msg.type() == wire::MessageType::kSecAggData) return OnData(id, msg, nonce);
  return OnMaskedInput(id, msg, nonce, model_version);
}

Status SecureRound::OnData(const std::string& id, const wire::Message& msg,
                           const std::string& nonce) {
  const auto& data = std::get<wire::SecAggData>(msg.body);
  if (!secagg::IsStage(data.stage) || !secagg::FromMember(data.stage)) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure-aggregation stage ", data.stage, " is not a member's"));
  }
  if (data.nonce != nonce) {
    return absl::InvalidArgumentError("a secure-aggregation message with a stale nonce");
  }
  HUDDLE_ASSIGN_OR_RETURN(std::span<const std::byte> bytes, secagg::PayloadOf(msg));
  const auto stage = static_cast<secagg::Stage>(data.stage);
  MemberState& state = (*members_)[id];
  if (stage == secagg::Stage::kAdvertise) {
    if (stage_ != 0 || state != MemberState::kTraining) {
      return absl::InvalidArgumentError("a key advertisement out of turn");
    }
    std::optional<MemberCertificate> certificate;
    if (settings_.options->certificates) certificate = settings_.options->certificates(id);
    if (!certificate) {
      return absl::FailedPreconditionError(
          absl::StrCat("client ", id,
                       " has no certificate from the project key: members accept only "
                       "certified peers (huddle certify; docs/security.md)"));
    }
    HUDDLE_ASSIGN_OR_RETURN(auto keys, secagg::Decode<secagg::Advertisement>(bytes));
    HUDDLE_RETURN_IF_ERROR(server_->OnAdvertise(index_.at(id), *certificate, keys));
    state = MemberState::kSecAgg;
    return absl::OkStatus();
  }
  // Every other stage answers the current one, once.
  static constexpr int kStageOf[] = {0, 0, 0, 1, 0, 2, 0, 3, 0, 0, 5, 0, 6};
  if (awaiting_.count(id) == 0 || kStageOf[data.stage] != stage_) {
    return absl::InvalidArgumentError(
        absl::StrCat("a secure-aggregation ", secagg::StageName(stage), " out of turn"));
  }
  const uint32_t p = position_.at(id);
  Status st;
  switch (stage) {
    case secagg::Stage::kReveal: {
      HUDDLE_ASSIGN_OR_RETURN(auto m, secagg::Decode<secagg::Reveal>(bytes));
      st = server_->OnReveal(p, m);
      break;
    }
    case secagg::Stage::kShares: {
      HUDDLE_ASSIGN_OR_RETURN(auto m, secagg::Decode<secagg::ShareKeys>(bytes));
      st = server_->OnShareKeys(p, m);
      break;
    }
    case secagg::Stage::kVerdict: {
      HUDDLE_ASSIGN_OR_RETURN(auto m, secagg::Decode<secagg::Verdict>(bytes));
      st = server_->OnVerdict(p, m);
      break;
    }
    case secagg::Stage::kConsistency: {
      HUDDLE_ASSIGN_OR_RETURN(auto m, secagg::Decode<secagg::Consistency>(bytes));
      st = server_->OnConsistency(p, m);
      break;
    }
    case secagg::Stage::kUnmaskResponse: {
      HUDDLE_ASSIGN_OR_RETURN(auto m, secagg::Decode<secagg::UnmaskResponse>(bytes));
      st = server_->OnUnmask(p, m);
      break;
    }
    default:
      st = absl::InvalidArgumentError("not a member's stage");
  }
  if (st.ok()) awaiting_.erase(id);
  return st;
}

Status SecureRound::OnMaskedInput(const std::string& id, const wire::Message& msg,
                                  const std::string& nonce, uint64_t model_version) {
  const auto& b = std::get<wire::SecAggMaskedInput>(msg.body);
  auto m = members_->find(id);
  if (stage_ != 4 || m == members_->end() || m->second != MemberState::kUploading ||
      b.nonce != nonce || b.model_version != model_version) {
    return absl::InvalidArgumentError(
        "a masked input without an upload grant, or with a stale nonce or version");
  }
  // Its tensors: the model's, by name and shape, then the weight word; all of the session's
  // width. Gathered into one buffer (the words of a tensor may be only 4-byte aligned), in the
  // session's own width: 32-bit words take half the memory of 64-bit ones.
  const ModelLayout& layout = settings_.layout;
  const size_t expected = layout.size() + (weight_cap_ > 0 ? 1 : 0);
  const DType dtype = plan_.bits == 32 ? DType::kUint32 : DType::kUint64;
  if (msg.tensors.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("a masked input of ", msg.tensors.size(),
                                                   " tensors; the round's has ", expected));
  }
  scratch64_.clear();
  scratch32_.clear();
  for (size_t i = 0; i < msg.tensors.size(); ++i) {
    const wire::TensorPayload& t = msg.tensors[i];
    const TensorSpec want = i < layout.size() ? TensorSpec{layout[i].name, dtype, layout[i].shape}
                                              : TensorSpec{kWeightName, dtype, {1}};
    if (t.spec != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("masked tensor ", i, " is '", t.spec.name, "' ", ShapeString(t.spec.shape),
                       " ", DTypeName(t.spec.dtype), "; the round's is '", want.name, "' ",
                       ShapeString(want.shape), " ", DTypeName(dtype)));
    }
    const size_t words = static_cast<size_t>(t.spec.NumElements());
    if (dtype == DType::kUint64) {
      const size_t at = scratch64_.size();
      scratch64_.resize(at + words);
      std::memcpy(scratch64_.data() + at, t.bytes.data(), words * 8);
    } else {
      const size_t at = scratch32_.size();
      scratch32_.resize(at + words);
      std::memcpy(scratch32_.data() + at, t.bytes.data(), words * 4);
    }
  }
  const uint32_t position = position_.at(id);
  HUDDLE_RETURN_IF_ERROR(
      dtype == DType::kUint64
          ? server_->OnMaskedInput(position, std::span<const uint64_t>(scratch64_))
          : server_->OnMaskedInput(position, std::span<const uint32_t>(scratch32_)));
  m->second = MemberState::kSecAgg;  // its upload is done
  UploadReceived(id);
  return absl::OkStatus();
}

}  // namespace huddle::coordinator
