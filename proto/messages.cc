#include "proto/messages.h"

#include <cctype>
#include <cstring>

namespace huddle::wire {

TensorPayload TensorPayload::CopyOf(const Tensor& t) {
  auto data = std::make_shared<std::vector<float>>(t.data);
  TensorPayload p;
  p.spec = t.spec;
  p.bytes = std::as_bytes(std::span<const float>(*data));
  p.owner = std::move(data);
  return p;
}

TensorPayload TensorPayload::ShareOf(std::shared_ptr<const TensorList> list, size_t index) {
  const Tensor& t = (*list)[index];
  TensorPayload p;
  p.spec = t.spec;
  p.bytes = std::as_bytes(std::span<const float>(t.data));
  p.owner = std::move(list);
  return p;
}

std::vector<TensorPayload> ShareAll(std::shared_ptr<const TensorList> list) {
  std::vector<TensorPayload> out;
  out.reserve(list->size());
  for (size_t i = 0; i < list->size(); ++i) out.push_back(TensorPayload::ShareOf(list, i));
  return out;
}

TensorList ToTensors(const std::vector<TensorPayload>& payloads) {
  TensorList out;
  out.reserve(payloads.size());
  for (const TensorPayload& p : payloads) {
    Tensor t;
    t.spec = p.spec;
    auto f = p.floats();
    t.data.assign(f.begin(), f.end());
    out.push_back(std::move(t));
  }
  return out;
}

bool IsValidClientId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

const char* ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kUnspecified:
      return "unspecified";
    case ErrorCode::kVersionMismatch:
      return "version_mismatch";
    case ErrorCode::kMalformed:
      return "malformed";
    case ErrorCode::kUnknownClient:
      return "unknown_client";
    case ErrorCode::kWrongRound:
      return "wrong_round";
    case ErrorCode::kInvalidUpdate:
      return "invalid_update";
    case ErrorCode::kRejected:
      return "rejected";
    case ErrorCode::kAuthRefused:
      return "auth_refused";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

const char* MessageTypeName(MessageType type) {
  switch (type) {
    case MessageType::kJoin:
      return "Join";
    case MessageType::kWelcome:
      return "Welcome";
    case MessageType::kFitInstruction:
      return "FitInstruction";
    case MessageType::kUploadRequest:
      return "UploadRequest";
    case MessageType::kUploadGrant:
      return "UploadGrant";
    case MessageType::kFitResult:
      return "FitResult";
    case MessageType::kHeartbeat:
      return "Heartbeat";
    case MessageType::kError:
      return "Error";
    case MessageType::kShutdown:
      return "Shutdown";
    case MessageType::kEvaluateInstruction:
      return "EvaluateInstruction";
    case MessageType::kEvaluateResult:
      return "EvaluateResult";
    case MessageType::kSecAggMaskedInput:
      return "SecAggMaskedInput";
    case MessageType::kSecAggData:
      return "SecAggData";
    case MessageType::kJobOffer:
      return "JobOffer";
  }
  return "Unknown";
}

size_t Message::PayloadBytes() const {
  size_t n = 0;
  for (const TensorPayload& t : tensors) n += t.bytes.size();
  return n;
}

Message MakeMessage(Body body, uint64_t round, std::string sender) {
  Message m;
  m.body = std::move(body);
  m.round = round;
  m.sender = std::move(sender);
  return m;
}

Message MakeError(ErrorCode code, std::string text, uint64_t round) {
  if (text.size() > kMaxErrorTextBytes) {
    size_t cut = kMaxErrorTextBytes;
    // Back to the start of a character: UTF-8 continuation bytes are 10xxxxxx.
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text.resize(cut);
    text += "...";
  }
  return MakeMessage(Error{code, std::move(text)}, round);
}

}  // namespace huddle::wire
