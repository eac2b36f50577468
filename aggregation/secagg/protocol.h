// Secure aggregation: the coordinator learns the sum of a session's integer vectors (mod 2^bits)
// and nothing else about any one of them, even when it cheats, as long as fewer than the assumed
// share of members collude with it. SecAgg (Bonawitz et al., CCS 2017) with its active-adversary
// additions (signed messages under a PKI, a consistency round), over SecAgg+'s sparse random graph
// (Bell et al., CCS 2020; graph.h), drawn from randomness the members contribute.
//
// Who is who. Every member has a long-term Ed25519 signing key, certified with its id and transport
// key by the project key (common/member_certificate.h), which the privacy owner holds, not the
// coordinator. Members pin the project's public key. Every key a member uses comes with a valid
// certificate and a signature by its holder; the coordinator can relay, drop or reorder messages,
// but not invent members nor substitute keys.
//
// A session (one round). n0 members are told a SessionConfig (session id, t, the graph's edge
// probability, the minimum m of survivors, the update's encoding) in their FitInstruction. Then:
//
//   A  advertise    member: two fresh X25519 pairs, c (sealing shares) and s (masks), and a
//                   commitment H(r) to 32 random bytes r.                      Client::Advertise
//      member list  coordinator: L = the advertisers in cohort order, each with its certificate
//                   (MemberList); a member's index from here on is its position in L.
//                                                                          Server::EndAdvertise
//   B  reveal       member: checks every certificate, its own entry, and the session against its
//                   own policy (PolicyCheck: the threshold, the graph and the minimum must hold
//                   against the colluders *it* assumes); then reveals r, signed with H(L).
//                                                             Client::OnMemberList -> Reveal
//      seeds        coordinator: every member's reveal (all of L must reveal, or the session
//                   ends).                                                 Server::EndReveal
//   C  share        member: checks all n signatures over the same H(L) (so every member saw the
//                   same L) and every commitment; the graph's seed is H(session, H(L), r_0..r_n-1):
//                   nobody chose it, the coordinator can only abort. Shamir-shares (t of its
//                   neighbours) its self-mask seed b and mask key s; for each neighbour a sealed
//                   pair of shares (XChaCha20-Poly1305 under AgreeKey(c_i, c_j)), the hashes of
//                   both shares, its commitment H(b), all signed.   Client::OnSeeds -> ShareKeys
//      share list   coordinator: to each member, the records its neighbours sealed to it.
//                                                                          Server::EndShareKeys
//   D  verdict      member: checks each record's signature, opens it, checks it against its
//                   hashes; a record that fails is a complaint naming its sender (the member
//                   just does not hold that share: nobody leaves for another's garbage).
//                                                          Client::OnShareList -> Verdict
//      mask         coordinator: U2 = the members whose secrets at least t members of U2 hold
//                   (complaints of a bad signature are checked: the liar, complainer or sender,
//                   is blamed and left out). To each member of U2: U2.   Server::EndVerdicts
//   E  masked input member: y_i = x_i + PRG(b_i) + sum over its neighbours j in U2 of +-PRG(s_ij)
//                   (s_ij = AgreeKey(s_i, s_j)), mod 2^bits.             Client::MaskInput
//      survivors    coordinator: adds the y_i as they arrive (O(length) memory); S = who sent one;
//                   refuses to go on (nothing revealed) when |S| < m. To each member of S: U2, S.
//                                                                        Server::EndMaskedInput
//   F  consistency  member: checks U2 is what it masked with, S within U2, itself in S, |S| >= m;
//                   signs (H(L), U2, S): one set per session.  Client::OnSurvivors -> Consistency
//      signatures   coordinator: the valid signatures of members of S.  Server::EndConsistency
//   G  unmask       member: reveals only after seeing floor((n + c) / 2) + 1 valid signatures of
//                   members of S over that same (U2, S), c its own count of colluders: no two sets
//                   can both gather that many, so every honest member unmasks by the same sets.
//                   For each neighbour it holds shares of: the share of b if it is in S, of s if
//                   it is in U2 but not S; never both.                Client::OnUnmask
//      result       coordinator: checks every revealed share against the hash its dealer signed
//                   (a wrong one blames the revealer and is set aside), rebuilds each b of S and
//                   each s of U2 \ S from t checked shares, removes the masks and releases the sum
//                   of S's inputs. Shares that match their hashes but do not rebuild one secret,
//                   or rebuild one its dealer did not commit to, blame the dealer.  Server::Finish
//
// What the coordinator learns, cheating or not, with up to c colluding members (graph.h): the
// inputs of its colluders, and for each honest survivor the sum of its part of the survivors in the
// graph: at least HonestShares(...) = m - c - cut honest inputs (cut: what dropping honest members
// can split away, bounded over the graph's randomness), except with probability
// 2^-security_bits per session. Never one honest member's input alone.
//
// What a lying member can do: add anything to the sum within the word width (inputs are masked:
// no range proof); refuse or send garbage at any stage (it is then a dropout, or blamed: a bad
// signature, a share that does not match its hash, a dealing that does not rebuild its commitment).
// Nothing it sends makes an honest member leave. The one failure it can still cause: shares that
// each match their signed hashes but do not rebuild one secret (a bad dealing, found only when
// rebuilt) end the session with nothing released; its dealer is named.
//
// Every message is validated and refused with an error naming the member and what is wrong; a
// refused message changes nothing. Thread-safety: none (one thread per object), but a
// SignatureCache may be shared between threads.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "aggregation/secagg/crypto.h"
#include "aggregation/secagg/graph.h"
#include "aggregation/secagg/shamir.h"
#include "common/member_certificate.h"
#include "common/signing.h"
#include "common/status.h"

namespace huddle::aggregation::secagg {

using SessionId = std::array<uint8_t, 32>;
using Hash32 = std::array<uint8_t, 32>;

// What every member is told before it trains (its FitInstruction), and signs as part of H(L).
struct SessionConfig {
  SessionId session{};          // random per session: binds every key, share and mask to it
  uint32_t members = 0;         // n0: the cohort the session was planned for; L has at most these
  uint32_t threshold = 0;       // t: shares that rebuild a secret
  uint64_t edge_threshold = 0;  // the graph's edge probability, in 2^-32 (graph.h)
  uint32_t min_survivors = 0;   // m: fewer masked inputs and nothing is unmasked
  int bits = 32;                // inputs and sums are integers mod 2^bits, bits 32 or 64
  uint64_t length = 0;          // words in an input
  // The update's encoding (client/secagg_member.h), signed with the rest so that every member
  // knows every other was told the same.
  int32_t scale_exponent = 0;
  uint64_t noise_variance = 0;
  uint64_t weight_cap = 0;
  double clip_norm = 0;
  bool operator==(const SessionConfig&) const = default;
};

// A: member -> coordinator.
struct Advertisement {
  PublicKey cipher_key{};
  PublicKey mask_key{};
  Hash32 seed_commitment{};  // SeedCommitment(session, r)
  bool operator==(const Advertisement&) const = default;
};
// A -> B: coordinator -> every member. members[i] is member i from here on.
struct ListedMember {
  uint32_t cohort_index = 0;  // its index in the FitInstruction
  MemberCertificate certificate;
  Advertisement keys;
  bool operator==(const ListedMember&) const = default;
};
struct MemberList {
  std::vector<ListedMember> members;
  bool operator==(const MemberList&) const = default;
};
// B: member -> coordinator; B -> C: coordinator -> every member (SeedList, in L's order).
struct Reveal {
  std::array<uint8_t, 32> seed{};  // r
  Signature signature{};           // over RevealMessage(session, H(L), index, r)
  bool operator==(const Reveal&) const = default;
};
struct SeedList {
  std::vector<Reveal> reveals;
  bool operator==(const SeedList&) const = default;
};
// C: member -> coordinator (one per neighbour), and C -> D: coordinator -> member (those sealed to
// it; `peer` is then the sender).
struct ShareRecord {
  uint32_t peer = 0;
  std::vector<uint8_t> ciphertext;  // sealed pair of shares (b's, s's)
  Hash32 self_mask_hash{};          // ShareHash of the b share
  Hash32 mask_key_hash{};           // ShareHash of the s share
  Hash32 self_mask_commitment{};    // the sender's H(b)
  Signature signature{};            // the sender's, over ShareMessage(...)
  bool operator==(const ShareRecord&) const = default;
};
struct ShareKeys {
  Hash32 self_mask_commitment{};  // BLAKE2b-256 of b
  std::vector<ShareRecord> shares;
  bool operator==(const ShareKeys&) const = default;
};
struct ShareList {
  std::vector<ShareRecord> shares;
  bool operator==(const ShareList&) const = default;
};
// D: member -> coordinator.
enum class Complaint : uint32_t {
  kMissing = 1,       // no record from this neighbour
  kBadSignature = 2,  // its record's signature does not verify
  kUnreadable = 3,    // the ciphertext does not open, or its shares are not shares
  kWrongShare = 4,    // a share does not match the hash its sender signed
};
const char* ComplaintName(Complaint c);
struct ComplaintRecord {
  uint32_t peer = 0;
  Complaint reason = Complaint::kMissing;
  bool operator==(const ComplaintRecord&) const = default;
};
struct Verdict {
  std::vector<ComplaintRecord> complaints;
  bool operator==(const Verdict&) const = default;
};
// D -> E: coordinator -> each member of U2. E -> F: coordinator -> each member of S.
struct MaskRequest {
  std::vector<uint32_t> shared;  // U2, sorted
  bool operator==(const MaskRequest&) const = default;
};
struct Survivors {
  std::vector<uint32_t> shared;     // U2, sorted
  std::vector<uint32_t> survivors;  // S, sorted
  bool operator==(const Survivors&) const = default;
};
// F: member -> coordinator; F -> G: coordinator -> members of S.
struct Consistency {
  Signature signature{};  // over SurvivorsMessage(session, H(L), U2, S)
  bool operator==(const Consistency&) const = default;
};
struct SignedBy {
  uint32_t member = 0;
  Signature signature{};
  bool operator==(const SignedBy&) const = default;
};
struct UnmaskRequest {
  std::vector<SignedBy> signatures;
  bool operator==(const UnmaskRequest&) const = default;
};
// G: member -> coordinator.
struct RevealedShare {
  uint32_t owner = 0;  // whose secret this is a share of
  Share share;
  bool operator==(const RevealedShare&) const = default;
};
struct UnmaskResponse {
  std::vector<RevealedShare> self_mask_shares;  // of neighbours in S
  std::vector<RevealedShare> mask_key_shares;   // of neighbours in U2 \ S
  bool operator==(const UnmaskResponse&) const = default;
};

// The Shamir point of member i's shares: i + 1.
inline uint64_t SharePoint(uint32_t index) { return uint64_t{index} + 1; }

// The transcript: the hashes and the bytes every signature covers, for members and coordinator
// alike (each domain-separated, every field fixed-size or length-prefixed).
Hash32 SeedCommitment(const SessionId& session, const std::array<uint8_t, 32>& seed);
Hash32 MemberListDigest(const SessionConfig& config, const MemberList& list);
std::vector<uint8_t> RevealMessage(const SessionId& session, const Hash32& list_digest,
                                   uint32_t index, const std::array<uint8_t, 32>& seed);
GraphSeed JointSeed(const SessionId& session, const Hash32& list_digest, const SeedList& seeds);
Hash32 ShareHash(const SessionId& session, bool self_mask, uint32_t from, uint32_t to,
                 const Share& share);
// What `from` signs for the record it seals to `to` (the record's `peer` is not covered: it is
// `to` on the way in and `from` on the way out).
std::vector<uint8_t> ShareMessage(const SessionId& session, const Hash32& list_digest,
                                  uint32_t from, uint32_t to, const ShareRecord& record);
std::vector<uint8_t> SurvivorsMessage(const SessionId& session, const Hash32& list_digest,
                                      const Survivors& sets);
// The bytes a sealed share pair is bound to (session, sender, receiver).
std::vector<uint8_t> ShareAssociatedData(const SessionId& session, uint32_t from, uint32_t to);

// Verified signatures, remembered, for the signatures a member sees again: certificates (every
// session), and in the in-process simulation, whose members share one cache, the reveals and
// consistency signatures every member checks. A deployed client keeps its own. Bounded: two
// generations of at most kGeneration entries each; when the newer fills, the older is dropped
// (what it held is verified again when next seen). Thread-safe.
class SignatureCache {
 public:
  static constexpr size_t kGeneration = size_t{1} << 17;  // ~10 MiB at the most in all

  explicit SignatureCache(size_t generation = kGeneration) : generation_(generation) {}
  bool Verify(const SigningPublicKey& key, std::span<const uint8_t> message,
              const Signature& signature);
  size_t size() const;

 private:
  struct HashOf {
    size_t operator()(const Hash32& h) const {
      size_t v;
      std::memcpy(&v, h.data(), sizeof v);  // a BLAKE2b digest: any 8 bytes are uniform
      return v;
    }
  };
  size_t generation_;
  mutable absl::Mutex mu_;
  // BLAKE2b of (key, message, signature).
  std::unordered_set<Hash32, HashOf> newer_ ABSL_GUARDED_BY(mu_);
  std::unordered_set<Hash32, HashOf> older_ ABSL_GUARDED_BY(mu_);
};

// What a member requires of a session, whatever the coordinator says (its own assumptions).
struct MemberPolicy {
  SigningPublicKey project_key{};      // pinned: certifies every member
  double corrupt_fraction = 0.1;       // of a session, colluding with the coordinator, in [0, 0.5)
  int security_bits = 40;              // the session's total failure <= 2^-this
  std::function<uint64_t()> now_unix;  // for certificates' expiry (nullptr: the system clock)
  SignatureCache* cache = nullptr;     // nullptr: verify every signature
};

// What a session guarantees by a member's own count (its policy), once L is known.
struct SessionGuarantee {
  int64_t members = 0;        // n = |L|
  int64_t colluders = 0;      // c = floor(corrupt_fraction * n)
  int64_t cut = 0;            // honest survivors dropping can split away (graph.h)
  int64_t honest_shares = 0;  // m - c - cut: honest inputs in any sum the coordinator can unmask
  int64_t quorum = 0;         // signatures over one survivor set needed before unmasking
  double failure_bits = 0;    // the session fails its guarantee with probability <= 2^-this
};

// One member's side.
class Client {
 public:
  // InvalidArgument for a config out of range, or a policy out of range.
  static StatusOr<Client> Create(const SessionConfig& config, uint32_t cohort_index, std::string id,
                                 SigningKey identity, MemberPolicy policy);

  const SessionConfig& config() const { return config_; }
  uint32_t index() const { return index_; }  // in L (after OnMemberList)
  // Set by OnMemberList.
  const std::optional<SessionGuarantee>& guarantee() const { return guarantee_; }
  const std::vector<uint32_t>& neighbours() const { return neighbours_; }

  // A.
  Advertisement Advertise() const;
  // B. PermissionDenied for a certificate that does not verify, InvalidArgument for a list that
  // does not hold this member exactly once as advertised, repeats an id or key, or is too large;
  // FailedPrecondition when the session is weaker than this member's policy (the message names
  // the numbers).
  StatusOr<Reveal> OnMemberList(const MemberList& list);
  // C. InvalidArgument for a list of the wrong length, a signature that does not verify, a
  // reveal that does not open its commitment or a neighbour's small-order key; FailedPrecondition
  // for fewer than t neighbours.
  StatusOr<ShareKeys> OnSeeds(const SeedList& seeds);
  // D. Never fails for a neighbour's garbage (that is a complaint); InvalidArgument for a record
  // from a non-neighbour or a second one.
  StatusOr<Verdict> OnShareList(const ShareList& shares);
  // E: the masked `input` (config().length words, each < 2^bits). InvalidArgument for a U2 that
  // is unsorted, repeats, does not hold this member or holds a member out of range; a wrong
  // length or word out of range; FailedPrecondition below the minimum or out of order.
  StatusOr<std::vector<uint64_t>> MaskInput(const MaskRequest& request,
                                            std::span<const uint64_t> input);
  // F. InvalidArgument when U2 is not the one masked with, S is not within it, unsorted, or lacks
  // this member; FailedPrecondition below the minimum.
  StatusOr<Consistency> OnSurvivors(const Survivors& sets);
  // G. FailedPrecondition (nothing revealed) with fewer valid signatures of members of S than the
  // quorum; InvalidArgument for a signer outside S or twice.
  StatusOr<UnmaskResponse> OnUnmask(const UnmaskRequest& request);

  Client(const Client&) = default;
  Client(Client&&) = default;
  Client& operator=(const Client&) = default;
  Client& operator=(Client&&) = default;
  ~Client();  // wipes b, r and the shares held (the key pairs wipe themselves)

 private:
  Client(const SessionConfig& config, uint32_t cohort_index, std::string id, SigningKey identity,
         MemberPolicy policy);
  bool Verify(const SigningPublicKey& key, std::span<const uint8_t> message,
              const Signature& signature) const;

  enum class Stage { kAdvertised, kRevealed, kShared, kJudged, kMasked, kSigned, kDone };
  SessionConfig config_;
  uint32_t cohort_index_ = 0;
  std::string id_;
  SigningKey identity_;
  MemberPolicy policy_;
  Stage stage_ = Stage::kAdvertised;
  uint32_t index_ = 0;
  KeyPair cipher_;
  KeyPair mask_;
  std::array<uint8_t, 32> seed_{};  // r
  // From L, only what later stages need (a list of n members is not kept whole: a simulation
  // holds n members at once): every member's signing key and commitment (stages C and G), then
  // each neighbour's keys.
  int64_t members_ = 0;
  std::vector<SigningPublicKey> signing_keys_;
  std::vector<Hash32> commitments_;
  std::vector<std::pair<PublicKey, PublicKey>> keys_;  // cipher, mask; only neighbours' after C
  Hash32 list_digest_{};
  std::optional<SessionGuarantee> guarantee_;
  std::vector<uint32_t> neighbours_;
  Secret self_mask_seed_{};  // b (stage C on)
  // Shares this member holds of its neighbours' secrets: index -> (b share, s share).
  std::map<uint32_t, std::pair<Share, Share>> held_;
  std::vector<uint32_t> shared_;  // U2, as masked with
  Survivors signed_;              // the sets signed
};

struct ServerOptions {
  // `session` is drawn by Create; t and edge_threshold come from `graph` unless both are set.
  SessionConfig config;
  // The coordinator's own assumptions (members check theirs): its colluder count sets the
  // consistency quorum it waits for.
  GraphOptions graph;
};

// A member the coordinator found lying, and how.
struct Blame {
  uint32_t member = 0;  // index in L
  std::string reason;
  bool operator==(const Blame&) const = default;
};

// The coordinator's side: one session.
class Server {
 public:
  // Draws the session id; t and the edge threshold from options.graph unless config sets both.
  // InvalidArgument for options out of range.
  static StatusOr<Server> Create(const ServerOptions& options);

  const SessionConfig& config() const { return config_; }
  // After EndAdvertise: the member list, and each listed member's cohort index.
  const MemberList& list() const { return list_; }
  // After EndReveal: the graph.
  const std::vector<std::vector<uint32_t>>& graph() const { return graph_; }
  const std::vector<Blame>& blames() const { return blames_; }

  // A. `certificate` is the member's as the coordinator enrolled it. InvalidArgument for an index
  // out of range, a second message or a small-order key.
  Status OnAdvertise(uint32_t cohort_index, const MemberCertificate& certificate,
                     const Advertisement& keys);
  // Ends A: L. FailedPrecondition (the session is refused) with fewer than m advertisers.
  StatusOr<MemberList> EndAdvertise();
  // B. InvalidArgument for a reveal that does not open its commitment or whose signature does
  // not verify (the member is blamed), or a second one.
  Status OnReveal(uint32_t index, const Reveal& reveal);
  // Ends B: every reveal, and the graph. FailedPrecondition naming who did not reveal (the
  // session cannot draw its graph without every member's randomness).
  StatusOr<SeedList> EndReveal();
  // C. InvalidArgument unless it holds exactly one record for each neighbour, each of a
  // plausible size; for a second message.
  Status OnShareKeys(uint32_t index, const ShareKeys& shares);
  // Ends C: for each member that shared, the records sealed to it.
  StatusOr<std::map<uint32_t, ShareList>> EndShareKeys();
  // D. InvalidArgument for a complaint about a member that sent it nothing or twice.
  Status OnVerdict(uint32_t index, const Verdict& verdict);
  // Ends D: U2 and each member's MaskRequest. FailedPrecondition with fewer than m in U2.
  StatusOr<std::map<uint32_t, MaskRequest>> EndVerdicts();
  // E: a member of U2's masked input, added to the sum. InvalidArgument for a wrong length, a
  // word >= 2^bits, a member not in U2 or a second input (the sum is then unchanged).
  Status OnMaskedInput(uint32_t index, std::span<const uint64_t> words);
  Status OnMaskedInput(uint32_t index, std::span<const uint32_t> words);  // bits 32
  // Ends E: S and each member of S's Survivors. FailedPrecondition (nothing will be unmasked)
  // with fewer than m, or when S is not connected in the graph.
  StatusOr<std::map<uint32_t, Survivors>> EndMaskedInput();
  // F. InvalidArgument for a member not in S, a second one, or a signature that does not verify.
  Status OnConsistency(uint32_t index, const Consistency& consistency);
  // Ends F: the signatures, to each member of S. FailedPrecondition with fewer than the quorum.
  StatusOr<std::map<uint32_t, UnmaskRequest>> EndConsistency();
  // G. InvalidArgument for a member not in S, a second response, a share of a non-neighbour, of
  // the wrong kind for its owner, or repeated. A share that does not match its dealer's hash is
  // set aside and its revealer blamed (the response is otherwise kept).
  Status OnUnmask(uint32_t index, const UnmaskResponse& response);
  // The sum of S's inputs mod 2^bits. FailedPrecondition when some needed secret has fewer than
  // t checked shares; DataLoss when checked shares do not rebuild the secret its dealer committed
  // to (the dealer is blamed). Either way nothing is released.
  StatusOr<std::vector<uint64_t>> Finish();

  // U1 = L, U2 (shared and held), S (sent a masked input), and who signed and answered G.
  size_t listed() const { return list_.members.size(); }
  const std::vector<uint32_t>& shared() const { return u2_; }
  const std::vector<uint32_t>& survivors() const { return s_; }
  const std::vector<uint32_t>& signers() const { return signers_; }
  const std::vector<uint32_t>& responders() const { return responders_; }
  // Records that a member complained of (complainer, sender), after EndVerdicts.
  const std::vector<std::pair<uint32_t, uint32_t>>& disputes() const { return disputes_; }
  int64_t quorum() const { return quorum_; }

 private:
  Server() = default;
  enum class Stage { kAdvertise, kReveal, kShare, kVerdict, kMasked, kConsistency, kUnmask, kDone };
  struct Member {
    std::optional<Reveal> reveal;
    std::optional<ShareKeys> shares;  // its records (ciphertexts dropped once forwarded)
    std::optional<Verdict> verdict;
    bool masked = false;
    std::optional<Signature> consistency;
    bool responded = false;
    std::vector<Share> self_mask_shares;  // of its b, revealed and checked
    std::vector<Share> mask_key_shares;   // of its s, revealed and checked
  };
  Status Expect(Stage stage, const char* what) const;
  Status CheckIndex(uint32_t index) const;
  void Blames(uint32_t member, std::string reason);
  void Subtract(std::span<const uint64_t> words, size_t count);

  SessionConfig config_;
  GraphOptions graph_options_;
  int64_t colluders_ = 0;
  int64_t quorum_ = 0;
  Stage stage_ = Stage::kAdvertise;
  std::map<uint32_t, ListedMember> advertised_;  // by cohort index
  MemberList list_;
  Hash32 list_digest_{};
  std::vector<std::vector<uint32_t>> graph_;
  std::vector<Member> members_;
  std::vector<uint64_t> sum_;  // of masked inputs, mod 2^64
  std::vector<uint32_t> u2_, s_, signers_, responders_;
  std::vector<std::pair<uint32_t, uint32_t>> disputes_;
  std::vector<Blame> blames_;
  uint64_t modulus_mask_ = 0;
};

}  // namespace huddle::aggregation::secagg
