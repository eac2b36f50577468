// embed_client: a federated-learning client whose training code is its own. It loads its shard of
// Fashion-MNIST, wraps an MLP trainer written in plain C++ (mlp_trainer.h) and hands it to the
// Huddle client SDK, which does the rest: joining the coordinator, encryption, the privacy policy,
// clipping and noise, and sending each round's update (huddle/client/client.h).
//
//   embed_client --coordinator tcp://127.0.0.1:5555 --key keys/site-1.key
//                --server-key keys/server.pub --shard 0 --num-shards 2
//   embed_client --coordinator tcp://127.0.0.1:5555 --insecure --client-id site-1 ...
//
// Exit status: 0 when the coordinator ended the job, 1 on a fatal error (the reason on stderr),
// 2 for a bad command line.
#include <huddle/client/client.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <string>
#include <string_view>

#include "idx.h"
#include "mlp_trainer.h"

namespace {

constexpr const char* kUsage = R"(usage: embed_client --coordinator tcp://HOST:PORT [options]

  --coordinator URL      the coordinator's endpoint
  --key FILE             this client's secret key (huddle keygen client --id ID)
  --server-key FILE      the coordinator's public key (server.pub)
  --insecure             plaintext, unauthenticated (a coordinator started with --insecure)
  --client-id ID         the client's id (default: the id in --key)
  --data DIR             Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)
  --shard N              this client's shard of the data, in [0, num-shards) (default 0)
  --num-shards N         contiguous shards the data is split into (default 1)
  --give-up-after-s S    give up after S seconds without a coordinator (default: keep trying)
  --log-level LEVEL      trace | debug | info | warn | error | off (default info)
  --version              print the Huddle SDK's version and exit
)";

struct Flags {
  huddle::client::ClientOptions options;
  std::string data = "/usr/share/datasets/fashion-mnist";
  int64_t shard = 0;
  int64_t num_shards = 1;
};

// Parses argv into *flags; false (with the reason on stderr) on a bad command line.
bool ParseFlags(int argc, char** argv, Flags* flags) {
  huddle::client::ClientOptions& o = flags->options;
  const std::map<std::string_view, std::string*> text = {{"--coordinator", &o.coordinator},
                                                         {"--key", &o.secret_key_file},
                                                         {"--server-key", &o.server_key_file},
                                                         {"--client-id", &o.client_id},
                                                         {"--data", &flags->data},
                                                         {"--log-level", &o.log_level}};
  const std::map<std::string_view, int64_t*> integers = {{"--shard", &flags->shard},
                                                         {"--num-shards", &flags->num_shards}};
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--insecure") {
      o.insecure = true;
      continue;
    }
    const bool known =
        text.contains(flag) || integers.contains(flag) || flag == "--give-up-after-s";
    if (!known || i + 1 >= argc) {
      std::cerr << "embed_client: " << (known ? "no value for " : "unknown flag ") << flag << "\n"
                << kUsage;
      return false;
    }
    const std::string value = argv[++i];
    try {
      if (auto it = text.find(flag); it != text.end()) {
        *it->second = value;
      } else if (auto in = integers.find(flag); in != integers.end()) {
        *in->second = std::stoll(value);
      } else {
        o.give_up_after_s = std::stod(value);
      }
    } catch (const std::exception&) {
      std::cerr << "embed_client: " << flag << " " << value << ": not a number\n";
      return false;
    }
  }
  if (flags->options.coordinator.empty()) {
    std::cerr << "embed_client: --coordinator is required\n" << kUsage;
    return false;
  }
  if (flags->num_shards < 1 || flags->shard < 0 || flags->shard >= flags->num_shards) {
    std::cerr << "embed_client: --shard " << flags->shard << " is outside [0, --num-shards "
              << flags->num_shards << ")\n";
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--version") {
      std::cout << "embed_client (Huddle client SDK " << huddle::client::Version() << ", git "
                << huddle::client::BuildRevision() << ")\n";
      return 0;
    }
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      return 0;
    }
  }
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;

  embed::Dataset train, test;
  try {
    // The same contiguous shard of the training and the test set: this site's local data.
    train = embed::LoadIdxShard(flags.data + "/train-images-idx3-ubyte.gz",
                                flags.data + "/train-labels-idx1-ubyte.gz", flags.shard,
                                flags.num_shards);
    test = embed::LoadIdxShard(flags.data + "/t10k-images-idx3-ubyte.gz",
                               flags.data + "/t10k-labels-idx1-ubyte.gz", flags.shard,
                               flags.num_shards);
  } catch (const std::exception& e) {
    std::cerr << "embed_client: cannot load the data: " << e.what() << "\n";
    return 1;
  }
  if (test.features != train.features) {
    std::cerr << "embed_client: the test images have " << test.features << " features, the "
              << "training images " << train.features << "\n";
    return 1;
  }
  std::cerr << "embed_client: shard " << flags.shard << "/" << flags.num_shards << ": "
            << train.rows << " training and " << test.rows << " test examples\n";

  embed::MlpTrainer trainer(train, test);
  try {
    huddle::client::Run(trainer, flags.options);
  } catch (const huddle::client::Error& e) {
    std::cerr << "embed_client: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
