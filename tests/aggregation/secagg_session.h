// Test harness for secure aggregation (aggregation/secagg/protocol.h): a project key, certified
// members, and a Session that runs a Server and n Clients through every stage in one process, with
// members dropping before any stage and hooks where a hostile member tampers with what it sends.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "aggregation/secagg/protocol.h"

namespace huddle::aggregation::secagg::testing {

// A client the project enrolled: its id, signing key and certificate.
struct Enrolled {
  std::string id;
  SigningKey key;
  MemberCertificate certificate;
};

// The privacy owner's project key, and what it certifies.
class Project {
 public:
  Project() : key_(SigningKey::Generate()) {}
  const SigningKey& key() const { return key_; }
  Enrolled Enrol(const std::string& id, uint64_t not_after = 0) const {
    SigningKey member = SigningKey::Generate();
    MemberCertificate c;
    c.id = id;
    c.transport_key = Hash(std::span(reinterpret_cast<const uint8_t*>(id.data()), id.size()));
    c.signing_key = member.public_key();
    c.not_after = not_after;
    return {id, member, Certify(c, key_)};
  }
  // A member's policy pinning this project.
  MemberPolicy Policy(double corrupt_fraction, SignatureCache* cache = nullptr) const {
    MemberPolicy p;
    p.project_key = key_.public_key();
    p.corrupt_fraction = corrupt_fraction;
    p.cache = cache;
    return p;
  }

 private:
  SigningKey key_;
};

// Members that leave before each stage (by cohort index; they send nothing from then on).
struct Drops {
  std::set<uint32_t> advertise, reveal, share, verdict, mask, consistency, unmask;
};

// Where a hostile member changes what it sends (by cohort index).
struct Tampering {
  std::function<void(uint32_t member, ShareKeys&)> shares;
  std::function<void(uint32_t member, Verdict&)> verdict;
  std::function<void(uint32_t member, UnmaskResponse&)> unmask;
};

inline std::set<uint32_t> RandomSubset(uint32_t n, double fraction, std::mt19937_64& rng) {
  std::set<uint32_t> out;
  std::bernoulli_distribution drop(fraction);
  for (uint32_t i = 0; i < n; ++i) {
    if (drop(rng)) out.insert(i);
  }
  return out;
}

inline uint64_t WordMask(int bits) { return bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1; }

// One session: the server, its members and their inputs. Members' policies assume the server's
// corrupt fraction unless `member_fraction` says otherwise.
class Session {
 public:
  explicit Session(const ServerOptions& options, uint64_t input_seed = 1,
                   std::optional<uint64_t> constant = std::nullopt,
                   std::optional<double> member_fraction = std::nullopt) {
    auto server = Server::Create(options);
    EXPECT_TRUE(server.ok()) << server.status();
    server_.emplace(*std::move(server));
    std::mt19937_64 rng(input_seed);
    const uint64_t mask = WordMask(options.config.bits);
    const double fraction = member_fraction.value_or(options.graph.corrupt_fraction);
    for (uint32_t i = 0; i < options.config.members; ++i) {
      enrolled_.push_back(project_.Enrol("member-" + std::to_string(i)));
      auto c = Client::Create(server_->config(), i, enrolled_[i].id, enrolled_[i].key,
                              project_.Policy(fraction, &cache_));
      EXPECT_TRUE(c.ok()) << c.status();
      clients_.push_back(*std::move(c));
      std::vector<uint64_t> x(options.config.length);
      for (uint64_t& w : x) w = constant ? *constant : rng() & mask;
      inputs_.push_back(std::move(x));
    }
  }

  Server& server() { return *server_; }
  Client& client(uint32_t i) { return clients_[i]; }
  const Enrolled& enrolled(uint32_t i) const { return enrolled_[i]; }
  const Project& project() const { return project_; }
  const std::vector<uint64_t>& input(uint32_t i) const { return inputs_[i]; }
  void set_input(uint32_t i, std::vector<uint64_t> words) { inputs_[i] = std::move(words); }
  // The cohort index of listed member p, and the listed position of cohort member i.
  uint32_t Cohort(uint32_t p) const { return server_->list().members[p].cohort_index; }
  uint32_t Position(uint32_t i) const {
    for (uint32_t p = 0; p < server_->listed(); ++p) {
      if (Cohort(p) == i) return p;
    }
    return UINT32_MAX;
  }
  // A hostile member `i` that changed its records signs them again (with its real key), so that
  // what it sent is what it signed.
  void Resign(uint32_t i, ShareKeys& sk) const {
    const Hash32 digest = MemberListDigest(server_->config(), server_->list());
    for (ShareRecord& r : sk.shares) {
      r.self_mask_commitment = sk.self_mask_commitment;
      r.signature = enrolled_[i].key.Sign(
          ShareMessage(server_->config().session, digest, Position(i), r.peer, r));
    }
  }

  // Runs every stage; the server's result (or the error of the stage that refused).
  StatusOr<std::vector<uint64_t>> Run(const Drops& drops, const Tampering& tamper = {}) {
    for (uint32_t i = 0; i < clients_.size(); ++i) {
      if (drops.advertise.count(i) != 0) continue;
      HUDDLE_RETURN_IF_ERROR(
          server_->OnAdvertise(i, enrolled_[i].certificate, clients_[i].Advertise()));
    }
    HUDDLE_ASSIGN_OR_RETURN(MemberList list, server_->EndAdvertise());
    for (uint32_t p = 0; p < list.members.size(); ++p) {
      if (drops.reveal.count(Cohort(p)) != 0) continue;
      HUDDLE_ASSIGN_OR_RETURN(Reveal r, clients_[Cohort(p)].OnMemberList(list));
      HUDDLE_RETURN_IF_ERROR(server_->OnReveal(p, r));
    }
    HUDDLE_ASSIGN_OR_RETURN(SeedList seeds, server_->EndReveal());
    for (uint32_t p = 0; p < list.members.size(); ++p) {
      if (drops.share.count(Cohort(p)) != 0) continue;
      StatusOr<ShareKeys> sk = clients_[Cohort(p)].OnSeeds(seeds);
      if (!sk.ok() && absl::IsFailedPrecondition(sk.status())) continue;  // too few neighbours
      HUDDLE_RETURN_IF_ERROR(sk.status());
      if (tamper.shares) tamper.shares(Cohort(p), *sk);
      HUDDLE_RETURN_IF_ERROR(server_->OnShareKeys(p, *sk));
    }
    HUDDLE_ASSIGN_OR_RETURN(auto share_lists, server_->EndShareKeys());
    for (auto& [p, shares] : share_lists) {
      if (drops.verdict.count(Cohort(p)) != 0) continue;
      HUDDLE_ASSIGN_OR_RETURN(Verdict v, clients_[Cohort(p)].OnShareList(shares));
      verdicts_[Cohort(p)] = v;
      if (tamper.verdict) tamper.verdict(Cohort(p), v);
      HUDDLE_RETURN_IF_ERROR(server_->OnVerdict(p, v));
    }
    HUDDLE_ASSIGN_OR_RETURN(auto masks, server_->EndVerdicts());
    for (auto& [p, request] : masks) {
      if (drops.mask.count(Cohort(p)) != 0) continue;
      HUDDLE_ASSIGN_OR_RETURN(std::vector<uint64_t> y,
                              clients_[Cohort(p)].MaskInput(request, inputs_[Cohort(p)]));
      masked_.emplace(Cohort(p), y);
      HUDDLE_RETURN_IF_ERROR(server_->OnMaskedInput(p, std::span<const uint64_t>(y)));
    }
    HUDDLE_ASSIGN_OR_RETURN(auto survivors, server_->EndMaskedInput());
    for (auto& [p, sets] : survivors) {
      if (drops.consistency.count(Cohort(p)) != 0) continue;
      HUDDLE_ASSIGN_OR_RETURN(Consistency c, clients_[Cohort(p)].OnSurvivors(sets));
      HUDDLE_RETURN_IF_ERROR(server_->OnConsistency(p, c));
    }
    HUDDLE_ASSIGN_OR_RETURN(auto requests, server_->EndConsistency());
    for (auto& [p, request] : requests) {
      if (drops.unmask.count(Cohort(p)) != 0 || drops.consistency.count(Cohort(p)) != 0) continue;
      HUDDLE_ASSIGN_OR_RETURN(UnmaskResponse r, clients_[Cohort(p)].OnUnmask(request));
      if (tamper.unmask) tamper.unmask(Cohort(p), r);
      HUDDLE_RETURN_IF_ERROR(server_->OnUnmask(p, r));
    }
    return server_->Finish();
  }

  // The plain sum of the survivors' inputs, mod 2^bits.
  std::vector<uint64_t> PlainSum() const {
    const uint64_t mask = WordMask(server_->config().bits);
    std::vector<uint64_t> sum(server_->config().length, 0);
    for (uint32_t p : server_->survivors()) {
      for (size_t w = 0; w < sum.size(); ++w) sum[w] += inputs_[Cohort(p)][w];
    }
    for (uint64_t& w : sum) w &= mask;
    return sum;
  }

  const std::map<uint32_t, std::vector<uint64_t>>& masked() const { return masked_; }
  const std::map<uint32_t, Verdict>& verdicts() const { return verdicts_; }

 private:
  Project project_;
  SignatureCache cache_;
  std::optional<Server> server_;
  std::vector<Enrolled> enrolled_;
  std::vector<Client> clients_;
  std::vector<std::vector<uint64_t>> inputs_;
  std::map<uint32_t, std::vector<uint64_t>> masked_;
  std::map<uint32_t, Verdict> verdicts_;
};

// Session options: n members of `bits`-bit words and `length` words, at least `min_survivors`
// (0: the consistency quorum), the graph chosen for `graph` unless t and k are given.
inline ServerOptions Options(uint32_t n, int bits, uint64_t length, uint32_t min_survivors = 0,
                             GraphOptions graph = {}) {
  ServerOptions o;
  o.config.members = n;
  o.config.bits = bits;
  o.config.length = length;
  o.config.clip_norm = 1;
  o.graph = graph;
  o.config.min_survivors =
      min_survivors > 0
          ? min_survivors
          : static_cast<uint32_t>(ConsistencyQuorum(n, Colluders(graph.corrupt_fraction, n)));
  return o;
}

}  // namespace huddle::aggregation::secagg::testing
