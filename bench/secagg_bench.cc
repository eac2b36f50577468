// Secure aggregation's compute, per round, for a model of 1M parameters (32-bit words), against
// baselines measured in the same run:
//
//   client   BM_ClientSecAgg/N: one member's whole part (quantize, seal shares to its k neighbours,
//            mask with k pairwise streams and its self mask, answer the unmasking) in a cohort of
//            N = 100 and 1000 (k from SecAgg+'s parameters: it grows like log N); baseline
//            BM_ClientCopy: one memcpy of the update.
//   server   BM_ServerSecAgg/100: adding 100 masked inputs and unmasking with 10 members dropped
//            after sharing their keys (their pairwise masks rebuilt and removed); baseline
//            BM_ServerPlainFold/100: folding 100 float updates into the exact streaming
//            aggregator, what the coordinator does without secure aggregation.
//
// Bytes per client: the masked input is as large as a float update (32-bit words: 4 MB); the
// counters key_bytes_out / key_bytes_in are the payloads of the other messages a member sends
// (its keys, sealed shares, revealed shares) and receives (neighbours' keys, shares sealed to
// it, the unmasking request): O(k), not O(N).
//
//   build/bench/secagg_bench [--benchmark_repetitions=3]
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "aggregation/secagg/protocol.h"
#include "aggregation/secagg/quantize.h"
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

// One member (index 0) of a session of N, with its k neighbours as real clients whose keys and
// shares it receives; everything it does after training is timed.
void BM_ClientSecAgg(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  auto params = ChooseParameters(n, GraphOptions{});
  if (!params.ok()) return state.SkipWithError(std::string(params.status().message()).c_str());
  const int k = (params->neighbours + 1) / 2 * 2 < static_cast<int>(n) - 1
                    ? (params->neighbours + 1) / 2 * 2
                    : static_cast<int>(n) - 1;
  SessionConfig config;
  config.members = n;
  config.threshold = static_cast<uint32_t>(params->threshold);
  config.bits = 32;
  config.length = kParams;
  config.min_survivors = config.threshold;
  auto plan = PlanQuantization({1.0, n, kParams});
  const std::vector<float> update = Update(2);
  std::mt19937_64 rng(3);
  std::vector<uint64_t> words(kParams);
  size_t bytes_out = 0;
  size_t bytes_in = 0;
  for (auto _ : state) {
    state.PauseTiming();
    // The neighbours: members 1..k, each with member 0 and the others as its own neighbours.
    std::vector<Client> clients;
    for (uint32_t i = 0; i <= static_cast<uint32_t>(k); ++i) {
      clients.push_back(*Client::Create(config, i));
    }
    auto list_for = [&](uint32_t self) {
      KeyList list;
      for (uint32_t j = 0; j <= static_cast<uint32_t>(k); ++j) {
        if (j != self) list.neighbours.push_back({j, clients[j].Advertise()});
      }
      return list;
    };
    std::vector<ShareKeys> sealed(clients.size());
    for (uint32_t i = 1; i < clients.size(); ++i) sealed[i] = *clients[i].SealShares(list_for(i));
    ShareList to_zero;
    for (uint32_t i = 1; i < clients.size(); ++i) {
      for (const SealedShare& s : sealed[i].shares) {
        if (s.peer == 0) to_zero.shares.push_back({i, s.ciphertext});
      }
    }
    const KeyList mine = list_for(0);
    state.ResumeTiming();

    Status q = Quantize(
        update, plan->scale_exponent, 32, [&] { return rng(); }, words);
    auto shares = clients[0].SealShares(mine);
    auto masked = clients[0].MaskInput(to_zero, words);
    UnmaskRequest request;
    request.total = n;
    for (uint32_t i = 0; i <= static_cast<uint32_t>(k); ++i) request.survivors.push_back(i);
    auto response = clients[0].Unmask(request);
    if (!q.ok() || !shares.ok() || !masked.ok() || !response.ok()) {
      return state.SkipWithError("the member's protocol failed");
    }
    benchmark::DoNotOptimize(masked->data());
    if (bytes_out == 0) {
      bytes_out = sizeof(AdvertiseKeys) + sizeof(shares->self_mask_commitment);
      for (const SealedShare& s : shares->shares) bytes_out += 4 + s.ciphertext.size();
      bytes_out += (response->self_mask_shares.size() + response->mask_key_shares.size()) *
                   (4 + sizeof(Share));
      bytes_in =
          mine.neighbours.size() * (4 + sizeof(AdvertiseKeys)) + 4 * (1 + request.survivors.size());
      for (const auto& s : to_zero.shares) bytes_in += 4 + s.ciphertext.size();
    }
  }
  state.counters["neighbours"] = k;
  state.counters["key_bytes_out"] = static_cast<double>(bytes_out);
  state.counters["key_bytes_in"] = static_cast<double>(bytes_in);
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

// Server side of a session of n members: stages 0-1 run for real (keys and shares), every member
// masks for real once (outside the timing), 10 drop after sharing; timed: adding the masked inputs
// and unmasking (rebuilding 90 self masks and the 10 dropped members' keys, and removing their
// masks).
void BM_ServerSecAgg(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  const uint32_t dropped = n / 10;
  for (auto _ : state) {
    state.PauseTiming();
    ServerOptions o;
    o.members = n;
    o.bits = 32;
    o.length = kParams;
    o.min_survivors = n / 2;
    auto server = Server::Create(o);
    std::vector<Client> clients;
    for (uint32_t i = 0; i < n; ++i) {
      clients.push_back(*Client::Create(server->config(), i));
      (void)server->OnAdvertise(i, clients[i].Advertise());
    }
    auto lists = server->EndAdvertise();
    for (auto& [i, list] : *lists) (void)server->OnShareKeys(i, *clients[i].SealShares(list));
    auto share_lists = server->EndShareKeys();
    std::vector<uint64_t> input(kParams, 7);
    std::vector<std::vector<uint64_t>> masked(n);
    for (auto& [i, list] : *share_lists) {
      if (i < dropped) continue;
      masked[i] = *clients[i].MaskInput(list, input);
    }
    state.ResumeTiming();

    for (uint32_t i = dropped; i < n; ++i) {
      (void)server->OnMaskedInput(i, std::span<const uint64_t>(masked[i]));
    }
    auto requests = server->EndMaskedInput();
    if (!requests.ok())
      return state.SkipWithError(std::string(requests.status().message()).c_str());
    for (auto& [i, request] : *requests) (void)server->OnUnmask(i, *clients[i].Unmask(request));
    auto sum = server->Finish();
    if (!sum.ok() || (*sum)[0] != uint64_t{7} * (n - dropped)) {
      return state.SkipWithError("the unmasked sum is wrong");
    }
    state.counters["neighbours"] = server->parameters().neighbours;
  }
  state.SetBytesProcessed(state.iterations() * (n - dropped) * kParams * 4);
}

BENCHMARK(BM_ClientCopy)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ClientSecAgg)->Arg(100)->Arg(1000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ServerPlainFold)->Arg(100)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ServerSecAgg)->Arg(100)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

}  // namespace
}  // namespace huddle::aggregation::secagg

BENCHMARK_MAIN();
