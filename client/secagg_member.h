// A client's part in one round's secure aggregation (aggregation/secagg/protocol.h), between the
// agent's FitInstruction and the coordinator's unmasking request.
//
// Create() turns the round's update (the clipped delta the agent formed, local noise included when
// the round asks for it) into the integers the coordinator will sum: each value scaled by
// weight / weight_cap when the round weighs by examples (FedAvg; the weight, min(examples, cap), is
// then one more word), stochastically rounded at 2^scale_exponent from the client's CSPRNG
// (aggregation/secagg/quantize.h), and, for distributed DP, with the client's share of the noise
// added: exact discrete Gaussian integers of the round's variance per coordinate
// (privacy/noise.h). Then each coordinator message gets its answer:
//
//   (after training)   -> SecAggAdvertise            Advertise()
//   SecAggKeyList      -> SecAggShares               OnKeyList()
//   SecAggShareList    -> (the masked input, sent after an UploadGrant)  OnShareList(),
//   MaskedInput() SecAggUnmask       -> SecAggUnmaskResponse       OnUnmask()
//
// Every error is the round's only (the agent answers with an Error and forgets the member).
//
// Thread-safety: none (the agent's thread).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "aggregation/secagg/protocol.h"
#include "common/status.h"
#include "common/tensor.h"
#include "privacy/noise.h"
#include "proto/messages.h"

namespace huddle::client {

class SecAggMember {
 public:
  // The weight word's tensor name in a masked input (after the model's tensors).
  static constexpr const char* kWeightName = "secagg.weight";

  // `update`: the round's update in the model's layout, L2 norm <= the instruction's clip norm
  // (the agent clipped it). `examples`: the FedAvg weight before the cap. InvalidArgument when the
  // instruction does not fit the model (its length) or a value cannot be quantized.
  static StatusOr<SecAggMember> Create(const wire::SecureAggregation& instruction,
                                       const std::string& nonce, const TensorList& update,
                                       int64_t examples, privacy::NoiseSource& noise);

  wire::SecAggAdvertise Advertise() const;
  StatusOr<wire::SecAggShares> OnKeyList(const wire::SecAggKeyList& list);
  // Masks the input with what the neighbours shared; MaskedInput() then holds it.
  Status OnShareList(const wire::SecAggShareList& list);
  bool masked() const { return !masked_.empty(); }
  // The masked input as a message of `round` (its words as uint32 or uint64 tensors in the
  // model's layout, then the weight word), once OnShareList succeeded.
  wire::Message MaskedInput(uint64_t round, uint64_t model_version, const std::string& sender,
                            const ModelLayout& layout) const;
  StatusOr<wire::SecAggUnmaskResponse> OnUnmask(const wire::SecAggUnmask& request);

  const std::string& nonce() const { return nonce_; }
  uint32_t index() const { return client_.index(); }

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
  std::vector<uint64_t> masked_;  // after OnShareList
  int bits_ = 32;
};

}  // namespace huddle::client
