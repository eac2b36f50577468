// Secure aggregation's compute, per round, for a model of 1M parameters (32-bit words), against
// baselines measured in the same run:
//
//   client   BM_ClientSecAgg/N: one member's whole part after training (quantize; check the member
//            list's N certificates and its own entry against its policy; reveal; check N reveal
//            signatures and commitments, draw the graph; deal and seal shares to its neighbours,
//            each record signed; open and check its neighbours' records; mask with a pairwise
//            stream per neighbour and its self mask; sign the survivor sets; check the consistency
//            quorum's signatures; answer the unmasking) in a session of N = 100 and 1000, with no
//            signature cache (a deployed client's case). Baseline BM_ClientCopy: one memcpy of
//            the update.
//   server   BM_ServerSecAgg/100: the coordinator's side of a session of 100 members, 10 of them
//            dropped after sharing: checking the reveals and consistency signatures, forwarding
//            the share records, adding 90 masked inputs, rebuilding 90 self masks and 10 mask keys
//            from checked shares and removing their masks. Baseline BM_ServerPlainFold/100:
//            folding 100 float updates into the exact streaming aggregator, what the coordinator
//            does without secure aggregation.
//
// Counters: neighbours (this member's degree), bytes_out / bytes_in (every stage's message but
// the masked input, as encoded for the wire: the member list and seed list grow with N, the rest
// with the degree). The masked input is as large as a float update (32-bit words: 4 MB).
//
//   build/bench/secagg_bench [--benchmark_repetitions=3]
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "aggregation/secagg/protocol.h"
#include "aggregation/secagg/quantize.h"
#include "aggregation/secagg/wire.h"
#include "aggregation/streaming_aggregator.h"
#include "benchmark/benchmark.h"

namespace huddle::aggregation::secagg {
namespace {

constexpr int64_t kParams = 1'000'000;

std::vector<float> Update(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0, 1e-3f);
  std::vector<float> v(kParams);
  for (float& x : v) x = normal(rng);
  return v;
}

void BM_ClientCopy(benchmark::State& state) {
  const std::vector<float> update = Update(1);
  std::vector<float> out(update.size());
  for (auto _ : state) {
    std::memcpy(out.data(), update.data(), update.size() * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kParams * 4);
}

// A project, its members, and a session's config for n of them (10% colluders, 10% dropouts,
// at least 90% survive).
struct Federation {
  SigningKey project = SigningKey::Generate();
  std::vector<SigningKey> keys;
  std::vector<MemberCertificate> certificates;
  SessionConfig config;

  explicit Federation(uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) {
      keys.push_back(SigningKey::Generate());
      MemberCertificate c;
      c.id = "member-" + std::to_string(i);
      c.transport_key = Hash(std::span(reinterpret_cast<const uint8_t*>(c.id.data()), c.id.size()));
      c.signing_key = keys.back().public_key();
      certificates.push_back(Certify(c, project));
    }
    GraphOptions g;
    config.members = n;
    config.min_survivors = n * 9 / 10;
    auto params = ChooseParameters(n, config.min_survivors, g);
    config.threshold = static_cast<uint32_t>(params->threshold);
    config.edge_threshold = params->edge_threshold;
    config.bits = 32;
    config.length = kParams;
    config.clip_norm = 1;
    for (size_t i = 0; i < config.session.size(); ++i) config.session[i] = static_cast<uint8_t>(i);
  }
  MemberPolicy Policy(SignatureCache* cache) const {
    MemberPolicy p;
    p.project_key = project.public_key();
    p.cache = cache;
    return p;
  }
  Client Member(uint32_t i, SignatureCache* cache) const {
    return *Client::Create(config, i, certificates[i].id, keys[i], Policy(cache));
  }
};

// Member 0 of a session of N: every other member's part runs untimed (with a shared signature
// cache, as the simulation does); member 0's runs timed and verifies everything itself.
void BM_ClientSecAgg(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  Federation fed(n);
  auto plan = PlanQuantization({1.0, n, kParams});
  const std::vector<float> update = Update(2);
  std::mt19937_64 rng(3);
  std::vector<uint64_t> words(kParams);
  size_t bytes_out = 0, bytes_in = 0, degree = 0;
  for (auto _ : state) {
    state.PauseTiming();
    SignatureCache shared;
    std::vector<Client> members;
    MemberList list;
    for (uint32_t i = 0; i < n; ++i) {
      members.push_back(fed.Member(i, i == 0 ? nullptr : &shared));
      list.members.push_back({i, fed.certificates[i], members[i].Advertise()});
    }
    SeedList seeds;
    seeds.reveals.resize(n);
    for (uint32_t i = 1; i < n; ++i) seeds.reveals[i] = *members[i].OnMemberList(list);
    bytes_in = Encode(list).size();
    state.ResumeTiming();

    Status q = Quantize(
        update, plan->scale_exponent, 32, [&] { return rng(); }, words);
    auto reveal = members[0].OnMemberList(list);
    if (!q.ok() || !reveal.ok()) return state.SkipWithError("the member list was refused");
    seeds.reveals[0] = *reveal;

    state.PauseTiming();
    bytes_in += Encode(seeds).size();
    const GraphSeed joint =
        JointSeed(fed.config.session, MemberListDigest(fed.config, list), seeds);
    const std::vector<uint32_t> mine = *Neighbours(joint, n, fed.config.edge_threshold, 0);
    ShareList to_zero;
    for (uint32_t j : mine) {
      auto sk = members[j].OnSeeds(seeds);
      if (!sk.ok()) return state.SkipWithError(std::string(sk.status().message()).c_str());
      for (const ShareRecord& r : sk->shares) {
        if (r.peer == 0) {
          ShareRecord in = r;
          in.peer = j;
          to_zero.shares.push_back(in);
        }
      }
    }
    MaskRequest request;
    request.shared.resize(n);
    std::iota(request.shared.begin(), request.shared.end(), 0u);
    const Survivors sets{request.shared, request.shared};
    UnmaskRequest unmask;
    const Hash32 digest = MemberListDigest(fed.config, list);
    const int64_t quorum = ConsistencyQuorum(n, Colluders(0.1, n));
    for (uint32_t i = 1; i <= static_cast<uint32_t>(quorum); ++i) {
      unmask.signatures.push_back(
          {i, fed.keys[i].Sign(SurvivorsMessage(fed.config.session, digest, sets))});
    }
    bytes_in += Encode(to_zero).size() + Encode(request).size() + Encode(sets).size() +
                Encode(unmask).size();
    state.ResumeTiming();

    auto shares = members[0].OnSeeds(seeds);
    auto verdict = members[0].OnShareList(to_zero);
    auto masked = members[0].MaskInput(request, words);
    auto consistency = members[0].OnSurvivors(sets);
    auto response = members[0].OnUnmask(unmask);
    if (!shares.ok() || !verdict.ok() || !masked.ok() || !consistency.ok() || !response.ok()) {
      return state.SkipWithError("the member's protocol failed");
    }
    benchmark::DoNotOptimize(masked->data());
    degree = mine.size();
    bytes_out = Encode(members[0].Advertise()).size() + Encode(*reveal).size() +
                Encode(*shares).size() + Encode(*verdict).size() + Encode(*consistency).size() +
                Encode(*response).size();
  }
  state.counters["neighbours"] = static_cast<double>(degree);
  state.counters["bytes_out"] = static_cast<double>(bytes_out);
  state.counters["bytes_in"] = static_cast<double>(bytes_in);
  state.SetBytesProcessed(state.iterations() * kParams * 4);
}

void BM_ServerPlainFold(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  ModelLayout layout = {{"w", DType::kFloat32, {kParams}}};
  AggregatorOptions options;
  options.max_abs_value = 1.0;
  auto agg = StreamingAggregator::Create(layout, options);
  std::vector<std::vector<float>> updates;
  for (int i = 0; i < 8; ++i) updates.push_back(Update(10 + static_cast<uint64_t>(i)));
  for (auto _ : state) {
    agg->Reset();
    for (int i = 0; i < n; ++i) {
      const std::span<const float> t = updates[static_cast<size_t>(i % 8)];
      Status st = agg->Fold(std::span<const std::span<const float>>(&t, 1), 1);
      if (!st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
    }
    TensorList mean;
    benchmark::DoNotOptimize(agg->Finalize(n, &mean).ok());
  }
  state.SetBytesProcessed(state.iterations() * n * kParams * 4);
}

// The coordinator's side of a session of n members: every member's part runs untimed (shared
// signature cache); the server's is timed. 10% drop after sharing their keys.
void BM_ServerSecAgg(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  const uint32_t dropped = n / 10;
  Federation fed(n);
  for (auto _ : state) {
    state.PauseTiming();
    ServerOptions o;
    o.config = fed.config;
    o.config.threshold = 0;  // chosen by the server (the same)
    o.config.edge_threshold = 0;
    auto server = Server::Create(o);
    if (!server.ok()) return state.SkipWithError(std::string(server.status().message()).c_str());
    SignatureCache shared;
    std::vector<Client> members;
    for (uint32_t i = 0; i < n; ++i) {
      members.push_back(*Client::Create(server->config(), i, fed.certificates[i].id, fed.keys[i],
                                        fed.Policy(&shared)));
    }
    state.ResumeTiming();
    for (uint32_t i = 0; i < n; ++i) {
      (void)server->OnAdvertise(i, fed.certificates[i], members[i].Advertise());
    }
    auto list = server->EndAdvertise();
    state.PauseTiming();
    std::vector<Reveal> reveals;
    for (uint32_t i = 0; i < n; ++i) reveals.push_back(*members[i].OnMemberList(*list));
    state.ResumeTiming();
    for (uint32_t i = 0; i < n; ++i) (void)server->OnReveal(i, reveals[i]);
    auto seeds = server->EndReveal();
    state.PauseTiming();
    std::vector<ShareKeys> sealed;
    for (uint32_t i = 0; i < n; ++i) sealed.push_back(*members[i].OnSeeds(*seeds));
    state.ResumeTiming();
    for (uint32_t i = 0; i < n; ++i) (void)server->OnShareKeys(i, sealed[i]);
    auto share_lists = server->EndShareKeys();
    state.PauseTiming();
    std::map<uint32_t, Verdict> verdicts;
    for (auto& [i, shares] : *share_lists) verdicts[i] = *members[i].OnShareList(shares);
    state.ResumeTiming();
    for (auto& [i, v] : verdicts) (void)server->OnVerdict(i, v);
    auto masks = server->EndVerdicts();
    state.PauseTiming();
    std::vector<uint64_t> input(kParams, 7);
    std::vector<std::vector<uint64_t>> masked(n);
    for (auto& [i, request] : *masks) {
      if (i >= dropped) masked[i] = *members[i].MaskInput(request, input);
    }
    state.ResumeTiming();
    for (uint32_t i = dropped; i < n; ++i) {
      (void)server->OnMaskedInput(i, std::span<const uint64_t>(masked[i]));
    }
    auto survivors = server->EndMaskedInput();
    if (!survivors.ok()) {
      return state.SkipWithError(std::string(survivors.status().message()).c_str());
    }
    state.PauseTiming();
    masked.clear();
    std::map<uint32_t, Consistency> signatures;
    for (auto& [i, sets] : *survivors) signatures[i] = *members[i].OnSurvivors(sets);
    state.ResumeTiming();
    for (auto& [i, c] : signatures) (void)server->OnConsistency(i, c);
    auto requests = server->EndConsistency();
    state.PauseTiming();
    std::map<uint32_t, UnmaskResponse> responses;
    for (auto& [i, request] : *requests) responses[i] = *members[i].OnUnmask(request);
    state.ResumeTiming();
    for (auto& [i, r] : responses) (void)server->OnUnmask(i, r);
    auto sum = server->Finish();
    if (!sum.ok() || (*sum)[0] != uint64_t{7} * (n - dropped)) {
      return state.SkipWithError("the unmasked sum is wrong");
    }
    state.counters["neighbours"] =
        EdgeProbability(server->config().edge_threshold) * static_cast<double>(n - 1);
  }
  state.SetBytesProcessed(state.iterations() * (n - dropped) * kParams * 4);
}

BENCHMARK(BM_ClientCopy)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ClientSecAgg)->Arg(100)->Arg(1000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ServerPlainFold)->Arg(100)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ServerSecAgg)->Arg(100)->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();

}  // namespace
}  // namespace huddle::aggregation::secagg

BENCHMARK_MAIN();
