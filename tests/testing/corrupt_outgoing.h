// Shared test helper: a client's outgoing messages corrupted before they leave, as a hostile or
// buggy member would send them. A test peer keeps one OutgoingRewrite and applies it to every
// answer of its agent; CorruptOutgoing builds one that edits the messages of one type (or of one
// secure-aggregation stage). EditWords and EditPayload are the usual edits.
//
//   peer.set_rewrite(CorruptOutgoing(Stage::kAdvertise, [](wire::Message& m) {
//     EditPayload<Advertisement>(m, [](Advertisement& a) { a.mask_key = {}; });
//   }));
//
// Header-only; a test that uses it links huddle_aggregation (the secure-aggregation payloads).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <variant>
#include <vector>

#include "aggregation/secagg/wire.h"
#include "proto/messages.h"

namespace huddle::testing {

// An edit of one message, and the rewrite of all the messages that one answer sends.
using MessageEdit = std::function<void(wire::Message&)>;
using OutgoingRewrite = std::function<void(std::vector<wire::Message>&)>;

// Whether `m` is the secure-aggregation message of `stage`.
inline bool IsStage(const wire::Message& m, aggregation::secagg::Stage stage) {
  return m.type() == wire::MessageType::kSecAggData &&
         std::get<wire::SecAggData>(m.body).stage == static_cast<uint32_t>(stage);
}

// A rewrite that edits every outgoing message of `type` with `edit` and leaves the others.
inline OutgoingRewrite CorruptOutgoing(wire::MessageType type, MessageEdit edit) {
  return [type, edit = std::move(edit)](std::vector<wire::Message>& out) {
    for (wire::Message& m : out) {
      if (m.type() == type) edit(m);
    }
  };
}
// The same for the secure-aggregation messages of `stage`.
inline OutgoingRewrite CorruptOutgoing(aggregation::secagg::Stage stage, MessageEdit edit) {
  return [stage, edit = std::move(edit)](std::vector<wire::Message>& out) {
    for (wire::Message& m : out) {
      if (IsStage(m, stage)) edit(m);
    }
  };
}

// `t`'s bytes read as 32-bit words, edited by `edit`, in a buffer that `t` owns from then on.
inline void EditWords(wire::TensorPayload& t,
                      const std::function<void(std::vector<uint32_t>&)>& edit) {
  auto words = std::make_shared<std::vector<uint32_t>>(t.bytes.size() / 4);
  std::memcpy(words->data(), t.bytes.data(), words->size() * 4);
  edit(*words);
  t.bytes = std::as_bytes(std::span(*words));
  t.owner = words;
}

// A secure-aggregation message's payload decoded as a T, edited by `edit`, and encoded again in
// its place (same round, sender and nonce). The payload must decode: it is the agent's own.
template <typename T>
void EditPayload(wire::Message& m, const std::function<void(T&)>& edit) {
  auto payload = aggregation::secagg::Decode<T>(*aggregation::secagg::PayloadOf(m));
  edit(*payload);
  m = aggregation::secagg::ToMessage(*payload, m.round, m.sender,
                                     std::get<wire::SecAggData>(m.body).nonce);
}

}  // namespace huddle::testing
