#include "common/member_certificate.h"

#include <string_view>

namespace huddle {
namespace {

constexpr std::string_view kDomain = "huddle-member-certificate-v1";

void Put(std::vector<uint8_t>& out, std::span<const uint8_t> bytes) {
  out.insert(out.end(), bytes.begin(), bytes.end());
}
void PutU64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

}  // namespace

std::vector<uint8_t> CertificateMessage(const MemberCertificate& c) {
  std::vector<uint8_t> out;
  out.reserve(kDomain.size() + 8 + c.id.size() + 32 + 32 + 8);
  Put(out, std::span(reinterpret_cast<const uint8_t*>(kDomain.data()), kDomain.size()));
  PutU64(out, c.id.size());
  Put(out, std::span(reinterpret_cast<const uint8_t*>(c.id.data()), c.id.size()));
  Put(out, c.transport_key);
  Put(out, c.signing_key);
  PutU64(out, c.not_after);
  return out;
}

MemberCertificate Certify(MemberCertificate certificate, const SigningKey& project) {
  certificate.signature = project.Sign(CertificateMessage(certificate));
  return certificate;
}

Status VerifyCertificate(const MemberCertificate& c, const SigningPublicKey& project,
                         uint64_t now_unix) {
  if (!VerifySignature(project, CertificateMessage(c), c.signature)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "client '", c.id.substr(0, 128), "': its certificate is not signed by the project key ",
        SigningFingerprint(project), " (another project's, or a field was altered)"));
  }
  if (c.not_after != 0 && now_unix > c.not_after) {
    return absl::PermissionDeniedError(absl::StrCat(
        "client '", c.id, "': its certificate expired (", c.not_after, " < now ", now_unix, ")"));
  }
  return absl::OkStatus();
}

}  // namespace huddle
