// Test helper: a job's (or a client's) YAML built key by key, instead of by string concatenation.
//
//   JobYaml().Set("name", "it").Set("rounds", 3).Set("train.epochs", 1).Set("model.hidden", "[32]")
//
// writes one line per top-level key and each section as a flow map, in the order the keys were
// first set:
//
//   name: it
//   rounds: 3
//   train: {epochs: 1}
//   model: {hidden: [32]}
//
// Header-only; any integration test may include it.
#pragma once

#include <charconv>
#include <concepts>
#include <string>
#include <string_view>
#include <vector>

#include "tests/integration/process.h"

namespace huddle::testing {

class JobYaml {
 public:
  // Sets `key` (dotted: "train.epochs" is `epochs` in the section `train`, nested as deep as the
  // dots go) to `value`, written as it is: a scalar or a flow collection ("[16]", "{a: 1}", a
  // path, "''" for an empty string). Setting a key again replaces its value in place.
  JobYaml& Set(std::string_view key, std::string_view value) {
    Node& node = At(key);
    node.children.clear();
    node.value = std::string(value);
    return *this;
  }
  JobYaml& Set(std::string_view key, const char* value) {
    return Set(key, std::string_view(value));
  }
  JobYaml& Set(std::string_view key, const std::string& value) {
    return Set(key, std::string_view(value));
  }
  template <std::integral T>
  requires(!std::same_as<T, bool>) JobYaml& Set(std::string_view key, T value) {
    return Set(key, std::string_view(std::to_string(value)));
  }
  // The shortest text that reads back as `value` (60 -> "60", 0.5 -> "0.5").
  JobYaml& Set(std::string_view key, double value) {
    char text[64];
    auto [end, ec] = std::to_chars(text, text + sizeof(text), value);
    return Set(key, std::string_view(text, static_cast<size_t>(end - text)));
  }
  // Adds `fields` ("a: 1, b: {c: 2}"), written as they are, to the end of section `key`: settings
  // that a test passes through as text.
  JobYaml& Fields(std::string_view key, std::string_view fields) {
    if (fields.empty()) return *this;
    Node& section = At(key);
    section.value.clear();
    section.children.push_back({"", std::string(fields), {}});
    return *this;
  }

  std::string Text() const {
    std::string out;
    for (const Node& n : root_.children) out += n.key + ": " + Render(n) + "\n";
    return out;
  }
  // Writes Text() to `path`; returns `path`.
  std::string Write(const std::string& path) const {
    WriteText(path, Text());
    return path;
  }

 private:
  struct Node {
    std::string key;    // "": a run of fields written as they are (Fields)
    std::string value;  // a leaf's text; a section has children instead
    std::vector<Node> children;
  };

  Node& At(std::string_view dotted) {
    Node* node = &root_;
    for (size_t start = 0; start <= dotted.size();) {
      size_t dot = dotted.find('.', start);
      if (dot == std::string_view::npos) dot = dotted.size();
      const std::string_view name = dotted.substr(start, dot - start);
      Node* child = nullptr;
      for (Node& c : node->children) {
        if (c.key == name) child = &c;
      }
      if (child == nullptr) child = &node->children.emplace_back(Node{std::string(name), "", {}});
      node = child;
      start = dot + 1;
    }
    return *node;
  }

  static std::string Render(const Node& n) {
    if (n.key.empty() || n.children.empty()) return n.value;
    std::string out = "{";
    for (size_t i = 0; i < n.children.size(); ++i) {
      const Node& c = n.children[i];
      if (i > 0) out += ", ";
      out += c.key.empty() ? c.value : c.key + ": " + Render(c);
    }
    return out + "}";
  }

  Node root_;
};

// A client's YAML (as examples/client.yaml) for client `id` holding shard `shard` of 20 (iid,
// partition seed 1), with the keys that cli::GenerateLocalKeys wrote into `keys` (server.pub,
// clients/ID.key); it retries after 0.1 s and gives up after 60 s.
inline JobYaml ClientYaml(const std::string& keys, const std::string& id, int shard) {
  JobYaml yaml;
  yaml.Set("client_id", id)
      .Set("data.partition", "iid")
      .Set("data.num_shards", 20)
      .Set("data.shard", shard)
      .Set("data.seed", 1)
      .Set("security.server_public_key", keys + "/server.pub")
      .Set("security.secret_key", keys + "/clients/" + id + ".key")
      .Set("connection.backoff_initial_s", 0.1)
      .Set("connection.give_up_after_s", 60);
  return yaml;
}

// A small job for the service's agents (a 3-agent cohort on their `fmnist` data set): `rounds`
// rounds of an MLP with 16 hidden units, evaluated every round.
inline JobYaml ServiceJobYaml(const std::string& name, int rounds, int seed) {
  JobYaml yaml;
  yaml.Set("name", name)
      .Set("seed", seed)
      .Set("rounds", rounds)
      .Set("model.kind", "mlp")
      .Set("model.hidden", "[16]")
      .Set("train.epochs", 1)
      .Set("train.batch_size", 64)
      .Set("train.learning_rate", 0.05)
      .Set("cohort.sampling", "fixed")
      .Set("cohort.size", 3)
      .Set("round.deadline_s", 60)
      .Set("round.quorum", 3)
      .Set("round.upload_slots", 3)
      .Set("evaluation.every", 1)
      .Set("coordinator.min_clients", 3)
      .Set("coordinator.wait_for_clients_s", 60)
      .Set("data.name", "fmnist");
  return yaml;
}

}  // namespace huddle::testing
