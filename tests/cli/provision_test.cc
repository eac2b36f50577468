// `huddle provision` (cli/provision.h) in process: project.yaml's errors, the kits' files and
// modes, no secret in another party's kit, re-runs that keep every key and change nothing,
// --add-site, --rotate and --remove-site, the store's refusals of foreign files, and a
// secure-aggregation project whose allow-list carries certificates the project key signed.
#include "cli/provision.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/commands.h"
#include "client/config.h"
#include "common/file_util.h"
#include "common/member_certificate.h"
#include "tests/integration/process.h"
#include "transport/curve_keys.h"

namespace huddle::cli {
namespace {

namespace fs = std::filesystem;
using testing::ReadAll;
using testing::WriteText;

class FixedClock final : public Clock {
 public:
  int64_t NowMs() const override { return 0; }
  int64_t WallMs() const override { return 1795000000000; }
};

constexpr char kTwoSites[] =
    "project: hospitals\n"
    "server: {address: coordinator.example.org, port: 5555}\n"
    "sites:\n"
    "  site-a: {datasets: {fmnist: {path: /srv/fmnist, partition: iid, num_shards: 2, shard: 0}}}\n"
    "  site-b:\n"
    "    datasets: {fmnist: {path: /srv/fmnist, partition: iid, num_shards: 2, shard: 1}}\n"
    "    privacy: {local: {require: true, max_epsilon: 8}}\n"
    "operators: [alice]\n";

// kTwoSites with one more site, `entry` (e.g. "  site-c: {}\n"), before the operators.
std::string WithSite(const std::string& entry) {
  std::string yaml = kTwoSites;
  return yaml.insert(yaml.find("operators:"), entry);
}

unsigned ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

int64_t MtimeNs(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
}

class ProvisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("provision");
    out_ = dir_ + "/kits";
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Project(const std::string& yaml) { WriteText(dir_ + "/project.yaml", yaml); }
  StatusOr<ProvisionResult> Provision(
      ProvisionOptions::Action action = ProvisionOptions::Action::kNone,
      const std::string& target = "", const std::string& out = "") {
    ProvisionOptions o;
    o.project_file = dir_ + "/project.yaml";
    o.out_dir = out.empty() ? out_ : out;
    o.action = action;
    o.target = target;
    o.clock = &clock_;
    return cli::Provision(o);
  }
  void ProvisionOk(ProvisionOptions::Action action = ProvisionOptions::Action::kNone,
                   const std::string& target = "") {
    auto r = Provision(action, target);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // The kit's tarball unpacked by the system's tar into a fresh directory; its root.
  std::string Extract(const std::string& kit) {
    const std::string root = dir_ + "/x/" + kit + std::to_string(extracted_++);
    fs::create_directories(root);
    const testing::Finished f = testing::RunToEnd(
        {"/usr/bin/tar", "-xzf", out_ + "/" + kit + ".tar.gz", "-C", root, "--no-same-owner"},
        dir_ + "/tar.log", std::chrono::seconds(30));
    EXPECT_EQ(f.exit_code, 0) << f.log;
    return root;
  }
  // Every regular file under `root`, relative, sorted.
  static std::set<std::string> Files(const std::string& root) {
    std::set<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      if (e.is_regular_file()) files.insert(fs::relative(e.path(), root).string());
    }
    return files;
  }
  nlohmann::json Manifest() { return nlohmann::json::parse(ReadAll(out_ + "/manifest.json")); }
  std::string Fingerprint(const std::string& name) {
    return Manifest()["identities"][name]["fingerprint"].get<std::string>();
  }
  std::string PubFingerprint(const std::string& path) {
    auto keys = transport::ReadKeyFile(path, false);
    EXPECT_TRUE(keys.ok()) << keys.status();
    return keys.ok() ? transport::Fingerprint(keys->public_z85) : "";
  }

  FixedClock clock_;
  std::string dir_;
  std::string out_;
  int extracted_ = 0;
};

TEST_F(ProvisionTest, ProjectYamlErrorsNameTheKey) {
  const std::string head = "project: p\nserver: {address: h.example.org}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"project: p\nserver: {address: h}\nsitez: {}\n",
       "unknown key 'sitez' (did you mean 'sites'?"},
      {"server: {address: h}\n", "project: required"},
      {"project: p\nserver: {port: 5555}\n", "server.address: required"},
      {"project: p\nserver: {address: 'h h'}\n", "server.address: 'h h'"},
      {"project: p\nserver: {address: h, port: 70000}\n", "server.port: 70000 is out of range"},
      {"project: p\nserver: {address: h, operator_bind: '127.0.0.1:5556'}\n",
       "server.operator_bind: '127.0.0.1:5556' is not tcp://HOST:PORT"},
      {"project: p\nserver: {address: h, http_bind: 'nowhere'}\n", "server.http_bind"},
      {"project: p\nserver: {address: h, state_dir: var/lib}\n", "server.state_dir"},
      {"project: p\nserver: {address: h, colour: red}\n", "server: unknown key 'colour'"},
      {head + "sites: {'../x': {}}\n", "sites.../x: a site's name is 1-64 characters"},
      {head + "sites: {server: {}}\n", "sites.server: 'server' and 'project' name kits"},
      {head + "sites: {a: {}}\noperators: [a]\n", "operators: 'a' is also a site"},
      {head + "operators: [b, b]\n", "operators: 'b' appears twice"},
      {head + "operators: {b: {}}\n", "operators must be a list of names"},
      {head + "operators: ['-x']\n", "operators[0]: '-x' is not an operator's name"},
      {head + "sites: {a: {datasets: {f: {path: data/f}}}}\n",
       "sites.a.datasets.f.path: 'data/f' must be an absolute path"},
      {head + "sites: {a: {datasets: {f: {path: /f, partiton: iid}}}}\n",
       "sites.a.datasets.f: unknown key 'partiton' (did you mean 'partition'?"},
      {head + "sites: {a: {datasets: {f: {path: /f, partition: iid, num_shards: 2, shard: 2}}}}\n",
       "sites.a.datasets.f.shard: 2 is out of range for 2 shards"},
      {head + "sites: {a: {privacy: {ledger: /x, local: {require: true}}}}\n",
       "sites.a.privacy.ledger: set by huddle provision"},
      {head + "sites: {a: {privacy: {local: {requires: true}}}}\n",
       "sites.a.privacy.local: unknown key 'requires'"},
      {head + "sites: {a: {secure_aggregation: {corrupt_fraction: 0.2}}}\n",
       "sites.a.secure_aggregation: the site's assumptions in secure aggregation, which the "
       "project does not enable"},
      {head +
           "secure_aggregation: true\nsites: {a: {secure_aggregation: {corrupt_fraction: 0.7}}}\n",
       "sites.a.secure_aggregation.corrupt_fraction: 0.7 is out of range"},
      {head + "sites: {a: {device: tpu}}\n", "sites.a.device"},
      {head + "sites: {a: {colour: red}}\n", "sites.a: unknown key 'colour'"},
      {head + "secure_aggregation: maybe\n", "secure_aggregation: 'maybe' is not a boolean"},
      {"project: [\n", "YAML syntax error"},
  };
  for (const auto& [yaml, expected] : cases) {
    Project(yaml);
    auto r = Provision();
    ASSERT_FALSE(r.ok()) << yaml;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << yaml;
    EXPECT_NE(r.status().message().find(expected), std::string::npos)
        << yaml << "\n  got: " << r.status().message() << "\n  expected: " << expected;
    EXPECT_NE(r.status().message().find("project.yaml"), std::string::npos)
        << "the error names the file: " << r.status().message();
    EXPECT_FALSE(fs::exists(out_ + "/manifest.json")) << "nothing written for a bad project";
  }
  // The command: exit 2, the error on stderr.
  ProvisionFlags flags;
  flags.project = dir_ + "/project.yaml";
  flags.out_dir = out_;
  EXPECT_EQ(RunProvisionCommand(flags), kExitUsage);
  flags.rotate = "a";
  flags.remove_site = "b";
  EXPECT_EQ(RunProvisionCommand(flags), kExitUsage);
}

TEST_F(ProvisionTest, WritesEveryKitWithItsFilesAndModes) {
  Project(kTwoSites);
  ProvisionOk();
  for (const std::string kit : {"server", "site-a", "site-b", "operator-alice"}) {
    EXPECT_EQ(ModeOf(out_ + "/" + kit), 0700u) << kit;
    EXPECT_EQ(ModeOf(out_ + "/" + kit + ".tar.gz"), 0600u) << kit;
  }
  EXPECT_FALSE(fs::exists(out_ + "/project")) << "no secure aggregation: no project key";
  EXPECT_EQ(ModeOf(out_), 0700u);
  const std::string server = Extract("server");
  EXPECT_EQ(Files(server),
            (std::set<std::string>{"README.md", "server.yaml", "keys/server.key", "keys/server.pub",
                                   "keys/allowed/site-a.pub", "keys/allowed/site-b.pub",
                                   "keys/operators/alice.pub"}));
  EXPECT_EQ(ModeOf(server + "/keys/server.key"), 0600u);
  EXPECT_EQ(ModeOf(server + "/keys/server.pub"), 0644u);
  EXPECT_EQ(ModeOf(server + "/keys"), 0755u) << "the service's dynamic user reads the lists";
  const std::string yaml = ReadAll(server + "/server.yaml");
  for (const std::string expected :
       {"bind: tcp://0.0.0.0:5555", "operator_bind: tcp://127.0.0.1:5556",
        "state_dir: /var/lib/huddle/service", "server_secret_key: /etc/huddle/keys/server.key",
        "allowed_clients: /etc/huddle/keys/allowed", "operators: /etc/huddle/keys/operators",
        "bind: 127.0.0.1:9464"}) {
    EXPECT_NE(yaml.find(expected), std::string::npos) << expected << "\n" << yaml;
  }
  EXPECT_NE(ReadAll(server + "/README.md").find("sudo systemctl enable --now huddle.service"),
            std::string::npos);

  const std::string site = Extract("site-b");
  EXPECT_EQ(Files(site),
            (std::set<std::string>{"agents/site-b/README.md", "agents/site-b/agent.yaml",
                                   "agents/site-b/site-b.key", "agents/site-b/site-b.pub",
                                   "agents/site-b/server.pub"}));
  EXPECT_EQ(ModeOf(site + "/agents/site-b/site-b.key"), 0600u);
  EXPECT_EQ(ModeOf(site + "/agents/site-b"), 0755u) << "the agent's dynamic user reads agent.yaml";
  EXPECT_EQ(ReadAll(site + "/agents/site-b/server.pub"), ReadAll(server + "/keys/server.pub"));
  EXPECT_EQ(ReadAll(site + "/agents/site-b/site-b.pub"),
            ReadAll(server + "/keys/allowed/site-b.pub"));
  // The agent's config as `huddle agent` reads it.
  auto agent = client::LoadClientConfig(site + "/agents/site-b/agent.yaml");
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_EQ(agent->coordinator, "tcp://coordinator.example.org:5555");
  EXPECT_EQ(agent->client_id, "site-b");
  EXPECT_EQ(agent->security.secret_key, "/etc/huddle/agents/site-b/site-b.key");
  EXPECT_EQ(agent->security.server_public_key, "/etc/huddle/agents/site-b/server.pub");
  ASSERT_EQ(agent->datasets.count("fmnist"), 1u);
  EXPECT_EQ(agent->datasets["fmnist"].path, "/srv/fmnist");
  EXPECT_EQ(agent->datasets["fmnist"].shard, 1);
  EXPECT_EQ(agent->privacy.ledger_path, "/var/lib/huddle/agents/site-b/privacy.ledger");
  ASSERT_TRUE(agent->privacy.local.has_value());
  EXPECT_EQ(agent->privacy.local->max_epsilon, 8.0);
  const std::string readme = ReadAll(site + "/agents/site-b/README.md");
  EXPECT_NE(readme.find("tar -xzf site-b.tar.gz -C /etc/huddle --no-same-owner"),
            std::string::npos);
  EXPECT_NE(readme.find("sudo systemctl enable --now huddle-agent@site-b.service"),
            std::string::npos);
  EXPECT_NE(readme.find("/var/lib/huddle/agents/site-b/"), std::string::npos) << readme;

  const std::string op = Extract("operator-alice");
  EXPECT_EQ(Files(op),
            (std::set<std::string>{"operators/alice/README.md", "operators/alice/alice.key",
                                   "operators/alice/alice.pub", "operators/alice/server.pub"}));
  EXPECT_EQ(ModeOf(op + "/operators/alice"), 0700u);
  EXPECT_EQ(transport::ReadRoleKey(op + "/operators/alice/alice.key", "operator", true, "k").ok(),
            true);
  EXPECT_NE(ReadAll(op + "/operators/alice/README.md")
                .find("--service tcp://127.0.0.1:5556 --server-key "
                      "/etc/huddle/operators/alice/server.pub --key "
                      "/etc/huddle/operators/alice/alice.key"),
            std::string::npos);

  const nlohmann::json m = Manifest();
  for (const std::string name : {"server", "site-a", "site-b", "alice"}) {
    ASSERT_TRUE(m["identities"].contains(name)) << m.dump(2);
    EXPECT_EQ(m["identities"][name]["created"], "2026-11-18T11:06:40.000Z");
    EXPECT_FALSE(m["identities"][name].contains("pending"));
  }
  EXPECT_EQ(m["identities"]["site-a"]["fingerprint"],
            PubFingerprint(server + "/keys/allowed/site-a.pub"));
  EXPECT_EQ(m["identities"]["alice"]["role"], "operator");
}

TEST_F(ProvisionTest, NoKitHoldsAnotherPartysSecret) {
  Project(std::string(kTwoSites) + "secure_aggregation: true\n");
  ProvisionOk();
  const std::map<std::string, std::string> own_secret = {
      {"server", "keys/server.key"},
      {"site-a", "agents/site-a/site-a.key"},
      {"site-b", "agents/site-b/site-b.key"},
      {"operator-alice", "operators/alice/alice.key"},
      {"project", "project/project.key"}};
  for (const auto& [kit, secret] : own_secret) {
    const std::string root = Extract(kit);
    std::vector<std::string> secrets;
    for (const std::string& f : Files(root)) {
      const std::string text = ReadAll(root + "/" + f);
      // A key file's secret halves (agent.yaml's `secret_key:` is a path, not quoted).
      if (text.find("secret_key: \"") != std::string::npos ||
          text.find("signing_seed:") != std::string::npos) {
        secrets.push_back(f);
      }
    }
    EXPECT_EQ(secrets, std::vector<std::string>{secret}) << kit;
  }
}

TEST_F(ProvisionTest, ARerunKeepsEveryKeyAndChangesNoByte) {
  Project(kTwoSites);
  ProvisionOk();
  std::map<std::string, std::string> bytes;
  std::map<std::string, int64_t> mtimes;
  for (const auto& e : fs::recursive_directory_iterator(out_)) {
    if (!e.is_regular_file() || e.path().filename() == "manifest.json") continue;
    bytes[e.path().string()] = ReadAll(e.path().string());
    mtimes[e.path().string()] = MtimeNs(e.path().string());
  }
  ProvisionOk();
  for (const auto& [path, content] : bytes) {
    EXPECT_EQ(ReadAll(path), content) << path;
    EXPECT_EQ(MtimeNs(path), mtimes[path]) << path << " was written again";
  }
  // A new site in project.yaml: its kit, and the server's allow-list with it; the rest kept.
  Project(WithSite("  site-c: {}\n"));
  auto r = Provision();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(fs::exists(out_ + "/site-c.tar.gz"));
  EXPECT_TRUE(fs::exists(Extract("server") + "/keys/allowed/site-c.pub"));
  for (const std::string kept : {"/site-a/agents/site-a/site-a.key", "/server/keys/server.key",
                                 "/operator-alice/operators/alice/alice.key"}) {
    EXPECT_EQ(ReadAll(out_ + kept), bytes[out_ + kept]) << kept;
  }
  EXPECT_EQ(ReadAll(out_ + "/site-a.tar.gz"), bytes[out_ + "/site-a.tar.gz"]);
  EXPECT_NE(ReadAll(out_ + "/server.tar.gz"), bytes[out_ + "/server.tar.gz"]);
  // site-c declared no data set: its agent.yaml says so, and so does the run.
  EXPECT_NE(ReadAll(out_ + "/site-c/agents/site-c/agent.yaml").find("# TODO: declare"),
            std::string::npos);
  bool warned = false;
  for (const std::string& w : r->warnings) warned |= w.find("site-c") != std::string::npos;
  EXPECT_TRUE(warned);
}

TEST_F(ProvisionTest, AnAddedSiteIsKeptOnLaterRuns) {
  Project(kTwoSites);
  ProvisionOk();
  ProvisionOk(ProvisionOptions::Action::kAddSite, "lab-9");
  const std::string key = ReadAll(out_ + "/lab-9/agents/lab-9/lab-9.key");
  ASSERT_FALSE(key.empty());
  EXPECT_EQ(Manifest()["identities"]["lab-9"]["origin"], "add-site");
  EXPECT_NE(ReadAll(out_ + "/lab-9/agents/lab-9/README.md").find("Before starting the agent"),
            std::string::npos);
  ProvisionOk();
  EXPECT_EQ(ReadAll(out_ + "/lab-9/agents/lab-9/lab-9.key"), key);
  EXPECT_TRUE(fs::exists(Extract("server") + "/keys/allowed/lab-9.pub"));
  auto again = Provision(ProvisionOptions::Action::kAddSite, "lab-9");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  auto op = Provision(ProvisionOptions::Action::kAddSite, "alice");
  EXPECT_EQ(op.status().code(), absl::StatusCode::kAlreadyExists) << op.status();
  auto bad = Provision(ProvisionOptions::Action::kAddSite, "../x");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
}

TEST_F(ProvisionTest, RotateReplacesTheKeyInTheKitAndTheAllowList) {
  Project(kTwoSites);
  ProvisionOk();
  const std::string old_fp = Fingerprint("site-a");
  const std::string site_b = ReadAll(out_ + "/site-b.tar.gz");
  auto r = Provision(ProvisionOptions::Action::kRotate, "site-a");
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string new_fp = Fingerprint("site-a");
  EXPECT_NE(new_fp, old_fp);
  const std::string server = Extract("server");
  EXPECT_EQ(PubFingerprint(server + "/keys/allowed/site-a.pub"), new_fp);
  EXPECT_EQ(Files(server + "/keys/allowed"), (std::set<std::string>{"site-a.pub", "site-b.pub"}));
  const std::string site = Extract("site-a");
  EXPECT_EQ(PubFingerprint(site + "/agents/site-a/site-a.key"), new_fp);
  const nlohmann::json m = Manifest()["identities"]["site-a"];
  EXPECT_EQ(m["retired"][0]["fingerprint"], old_fp);
  EXPECT_EQ(m["rotated"], "2026-11-18T11:06:40.000Z");
  EXPECT_EQ(ReadAll(out_ + "/site-b.tar.gz"), site_b) << "another site's kit is untouched";
  bool said = false;
  for (const std::string& line : r->lines)
    said |= line.find("rotated (was " + old_fp) != std::string::npos;
  EXPECT_TRUE(said);
  // The server, operators and unknown names.
  ProvisionOk(ProvisionOptions::Action::kRotate, "server");
  EXPECT_EQ(PubFingerprint(Extract("site-b") + "/agents/site-b/server.pub"), Fingerprint("server"));
  ProvisionOk(ProvisionOptions::Action::kRotate, "alice");
  EXPECT_EQ(Provision(ProvisionOptions::Action::kRotate, "nobody").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ProvisionTest, RemoveSiteRevokesItAndDeletesItsKit) {
  Project(kTwoSites);
  ProvisionOk();
  const std::string fp = Fingerprint("site-b");
  ProvisionOk(ProvisionOptions::Action::kRemoveSite, "site-b");
  EXPECT_FALSE(fs::exists(out_ + "/site-b"));
  EXPECT_FALSE(fs::exists(out_ + "/site-b.tar.gz"));
  EXPECT_EQ(Files(Extract("server") + "/keys/allowed"), (std::set<std::string>{"site-a.pub"}));
  const nlohmann::json m = Manifest();
  EXPECT_FALSE(m["identities"].contains("site-b"));
  EXPECT_EQ(m["removed"]["site-b"]["fingerprint"], fp);
  EXPECT_FALSE(m["kits"].contains("site-b"));
  // Still in project.yaml: refused, saying how to go on.
  auto r = Provision();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("sites.site-b: revoked by --remove-site"), std::string::npos)
      << r.status();
  // Enrolled again: a new key.
  ProvisionOk(ProvisionOptions::Action::kAddSite, "site-b");
  EXPECT_NE(Fingerprint("site-b"), fp);
  EXPECT_FALSE(Manifest()["removed"].contains("site-b"));
  EXPECT_EQ(Provision(ProvisionOptions::Action::kRemoveSite, "alice").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ProvisionTest, ProjectYamlAndTheManifestMustAgree) {
  Project(kTwoSites);
  ProvisionOk();
  // A site dropped from project.yaml stays enrolled until revoked explicitly.
  std::string yaml = kTwoSites;
  yaml.erase(yaml.find("  site-a:"), yaml.find("  site-b:") - yaml.find("  site-a:"));
  Project(yaml);
  auto r = Provision();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'site-a' is enrolled"), std::string::npos) << r.status();
  ProvisionOk(ProvisionOptions::Action::kRemoveSite, "site-a");
  ProvisionOk();
  // An operator dropped from project.yaml is revoked.
  yaml.replace(yaml.find("operators: [alice]"), 18, "operators: []");
  Project(yaml);
  ProvisionOk();
  EXPECT_FALSE(fs::exists(out_ + "/operator-alice"));
  EXPECT_EQ(Files(Extract("server") + "/keys/operators"), std::set<std::string>{});
  EXPECT_EQ(Manifest()["removed"]["alice"]["role"], "operator");
  // Another project's store.
  Project("project: other\nserver: {address: h}\n");
  EXPECT_EQ(Provision().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ProvisionTest, AMissingKeyIsAnErrorUntilRotated) {
  Project(kTwoSites);
  ProvisionOk();
  fs::remove(out_ + "/site-a/agents/site-a/site-a.key");
  auto r = Provision();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("--rotate site-a"), std::string::npos) << r.status();
  ProvisionOk(ProvisionOptions::Action::kRotate, "site-a");
  // A key recorded as pending (a run stopped before writing it) is made again.
  nlohmann::json m = Manifest();
  m["identities"]["site-b"]["pending"] = true;
  WriteText(out_ + "/manifest.json", m.dump());
  fs::remove(out_ + "/site-b/agents/site-b/site-b.key");
  ProvisionOk();
  EXPECT_TRUE(fs::exists(out_ + "/site-b/agents/site-b/site-b.key"));
  EXPECT_FALSE(Manifest()["identities"]["site-b"].contains("pending"));
}

TEST_F(ProvisionTest, ForeignFilesAndPlacesAreRefused) {
  Project(kTwoSites);
  // An OUT that is not a store.
  fs::create_directories(out_);
  WriteText(out_ + "/notes.txt", "mine");
  auto r = Provision();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("notes.txt"), std::string::npos) << r.status();
  fs::remove(out_ + "/notes.txt");
  ProvisionOk();
  // A new site whose kit directory someone else's file is in the way of.
  fs::create_directories(out_ + "/site-c");
  Project(WithSite("  site-c: {}\n"));
  r = Provision();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find(out_ + "/site-c"), std::string::npos) << r.status();
  fs::remove(out_ + "/site-c");
  // A file that is not the kit's, where the kit writes one; and in a kit to delete.
  WriteText(out_ + "/site-a/agents/site-a/agent.yaml.orig", "mine");
  ProvisionOk();  // not in the way: left alone
  r = Provision(ProvisionOptions::Action::kRemoveSite, "site-a");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("agent.yaml.orig"), std::string::npos) << r.status();
  EXPECT_TRUE(fs::exists(out_ + "/site-a/agents/site-a/site-a.key")) << "nothing deleted";
  // A symbolic link inside a kit.
  fs::remove(out_ + "/site-b/agents/site-b/README.md");
  fs::create_symlink("/etc/hostname", out_ + "/site-b/agents/site-b/README.md");
  r = Provision();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("symbolic link"), std::string::npos) << r.status();
  fs::remove(out_ + "/site-b/agents/site-b/README.md");
  // OUT inside the installed tree, or inside a store.
  ProvisionOptions o;
  o.project_file = dir_ + "/project.yaml";
  o.out_dir = dir_ + "/etc/huddle/kits";
  o.etc_dir = dir_ + "/etc/huddle";
  EXPECT_EQ(cli::Provision(o).status().code(), absl::StatusCode::kInvalidArgument);
  r = Provision(ProvisionOptions::Action::kNone, "", out_ + "/site-a/agents/kits");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("a store of `huddle provision`"), std::string::npos);
  o.out_dir = out_ + "2";
  o.etc_dir = "etc";
  EXPECT_EQ(cli::Provision(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ProvisionTest, SecureAggregationCertifiesEverySiteAndSitesPinTheProject) {
  Project(std::string(kTwoSites) + "secure_aggregation: true\n");
  ProvisionOk();
  const std::string project = Extract("project");
  auto project_keys =
      transport::ReadRoleKey(project + "/project/project.pub", "project", false, "project");
  ASSERT_TRUE(project_keys.ok()) << project_keys.status();
  auto project_public = transport::SigningPublicKeyOf(*project_keys, "project");
  ASSERT_TRUE(project_public.ok());
  EXPECT_EQ(ModeOf(project + "/project"), 0700u);
  const std::string server = Extract("server");
  for (const std::string site : {"site-a", "site-b"}) {
    auto pub = transport::ReadKeyFile(server + "/keys/allowed/" + site + ".pub", false);
    ASSERT_TRUE(pub.ok());
    auto certificate = transport::CertificateOf(*pub, site);
    ASSERT_TRUE(certificate.ok()) << certificate.status();
    EXPECT_TRUE(VerifyCertificate(*certificate, *project_public, 1795000000).ok());
    const std::string kit = Extract(site);
    EXPECT_EQ(ReadAll(kit + "/agents/" + site + "/project.pub"),
              ReadAll(project + "/project/project.pub"));
    auto agent = client::LoadClientConfig(kit + "/agents/" + site + "/agent.yaml");
    ASSERT_TRUE(agent.ok()) << agent.status();
    EXPECT_EQ(agent->security.project_public_key, "/etc/huddle/agents/" + site + "/project.pub");
  }
  // A re-run certifies the same way: nothing changes.
  const std::string before = ReadAll(out_ + "/server.tar.gz");
  ProvisionOk();
  EXPECT_EQ(ReadAll(out_ + "/server.tar.gz"), before);
  // Rotating the project key certifies every site again.
  ProvisionOk(ProvisionOptions::Action::kRotate, "project");
  EXPECT_NE(ReadAll(out_ + "/server.tar.gz"), before);
}

TEST_F(ProvisionTest, EtcAndStateDirsGoIntoEveryPath) {
  Project(kTwoSites);
  ProvisionOptions o;
  o.project_file = dir_ + "/project.yaml";
  o.out_dir = out_;
  o.etc_dir = "/opt/test/etc/huddle/";
  o.state_dir = "/opt/test/var";
  o.clock = &clock_;
  auto r = cli::Provision(o);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string yaml = ReadAll(out_ + "/server/server.yaml");
  EXPECT_NE(yaml.find("server_secret_key: /opt/test/etc/huddle/keys/server.key"),
            std::string::npos);
  EXPECT_NE(yaml.find("state_dir: /opt/test/var/service"), std::string::npos) << yaml;
  const std::string agent = ReadAll(out_ + "/site-b/agents/site-b/agent.yaml");
  EXPECT_NE(agent.find("secret_key: /opt/test/etc/huddle/agents/site-b/site-b.key"),
            std::string::npos);
  EXPECT_NE(agent.find("ledger: /opt/test/var/agents/site-b/privacy.ledger"), std::string::npos);
  const std::string readme = ReadAll(out_ + "/site-b/agents/site-b/README.md");
  EXPECT_NE(readme.find("huddle agent --config /opt/test/etc/huddle/agents/site-b/agent.yaml"),
            std::string::npos)
      << readme;
  EXPECT_EQ(readme.find("systemctl"), std::string::npos) << "the units expect /etc/huddle";
}

}  // namespace
}  // namespace huddle::cli
