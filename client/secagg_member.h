// A client's part in one session of secure aggregation (aggregation/secagg/protocol.h), between
// the agent's FitInstruction and the unmasking.
//
// Create() turns the round's update (the clipped delta the agent formed, local noise included when
// the round asks for it) into the integers the coordinator will sum: each value scaled by
// weight / weight_cap when the round weighs by examples (the weight, min(examples, cap), is then
// one more word), stochastically rounded at 2^scale_exponent from the client's CSPRNG
// (aggregation/secagg/quantize.h), and, for distributed DP, with the client's share of the noise
// added: exact discrete Gaussian integers of the session's variance per coordinate
// (privacy/noise.h). Then each coordinator message (a wire::SecAggData) gets its answer:
//
//   (after training)     -> advertise                  Advertise()
//   member list          -> reveal                     OnMessage: checks every certificate and
//                                                      the session against this client's policy;
//                                                      guarantee() is then set
//   seed list            -> shares
//   share list           -> verdict
//   mask request         -> (the masked input, sent after an UploadGrant: MaskedInput())
//   survivor sets        -> consistency signature
//   unmask request       -> unmask response; done()
//
// Every error ends this client's part in the session (the agent answers with an Error and forgets
// the member); nothing it holds is revealed by an error.
//
// Thread-safety: none (the agent's thread).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "aggregation/secagg/protocol.h"
#include "common/signing.h"
#include "common/status.h"
#include "common/tensor.h"
#include "privacy/noise.h"
#include "proto/messages.h"

namespace huddle::client {

// Who this client is in secure aggregation and what it assumes, whatever the coordinator says.
struct SecAggIdentity {
  std::string id;
  SigningKey key = SigningKey::Generate();  // its certified signing key
  // The project key it pins, the colluders it assumes, the failure it accepts; the agent's
  // signature cache (shared by the simulation's members) is filled in by the agent.
  aggregation::secagg::MemberPolicy policy;
};

class SecAggMember {
 public:
  // The weight word's tensor name in a masked input (after the model's tensors).
  static constexpr const char* kWeightName = "secagg.weight";

  // `update`: the round's update in the model's layout, L2 norm <= the instruction's clip norm
  // (the agent clipped it). `examples`: the FedAvg weight before the cap. InvalidArgument when the
  // instruction does not fit the model (its length), a value cannot be quantized, or the session
  // is malformed.
  static StatusOr<SecAggMember> Create(const wire::SecureAggregation& instruction,
                                       const std::string& nonce, const TensorList& update,
                                       int64_t examples, privacy::NoiseSource& noise,
                                       const SecAggIdentity& identity);

  // The honest inputs a sum of the session the instruction plans would hold, by `policy`'s count
  // (the member list may only shrink it: checked again then). FailedPrecondition naming the
  // numbers when the planned session is weaker than the policy.
  static StatusOr<int64_t> PlannedHonestShares(const wire::SecureAggregation& instruction,
                                               const aggregation::secagg::MemberPolicy& policy);

  wire::Message Advertise(uint64_t round, const std::string& sender) const;
  // The answer to a coordinator's stage message: one reply, or none after a mask request (the
  // masked input then waits for an upload grant). InvalidArgument for a message that is not one
  // of the coordinator's stages or does not decode; the protocol's errors otherwise.
  StatusOr<std::vector<wire::Message>> OnMessage(const wire::Message& msg,
                                                 const std::string& sender);

  // After the member list: what the session guarantees by this client's own count.
  const std::optional<aggregation::secagg::SessionGuarantee>& guarantee() const {
    return client_.guarantee();
  }
  bool masked() const { return !masked_.empty(); }
  bool done() const { return done_; }
  // The masked input as a message of `round` (its words as uint32 or uint64 tensors in the
  // model's layout, then the weight word), once masked().
  wire::Message MaskedInput(uint64_t round, uint64_t model_version, const std::string& sender,
                            const ModelLayout& layout) const;

  const std::string& nonce() const { return nonce_; }

 private:
  SecAggMember(aggregation::secagg::Client client, std::string nonce, std::vector<uint64_t> input,
               int bits)
      : client_(std::move(client)),
        nonce_(std::move(nonce)),
        input_(std::move(input)),
        bits_(bits) {}

  aggregation::secagg::Client client_;
  std::string nonce_;
  std::vector<uint64_t> input_;   // quantized (and noised) update, then the weight word
  std::vector<uint64_t> masked_;  // after the mask request
  int bits_ = 32;
  bool done_ = false;
};

}  // namespace huddle::client
