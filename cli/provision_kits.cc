// The generated files of `huddle provision`'s kits (cli/provision.h): each party's config and
// the README.md that says what to run on its host. Pure functions of the project and the
// directories the kits install into.
#include <string>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/provision_internal.h"

namespace huddle::cli::provision {
namespace {

constexpr char kSystemEtc[] = "/etc/huddle";
constexpr char kSystemState[] = "/var/lib/huddle";

// The packages' layout, which the systemd units expect; anything else runs `huddle` by hand.
bool SystemLayout(const Dirs& dirs) { return dirs.etc == kSystemEtc && dirs.state == kSystemState; }

std::string Indent(const std::string& text) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&out, "  ", line, "\n");
  }
  return out;
}

std::string ServiceEndpoint(const ProjectSpec& spec) {
  return absl::StrCat("tcp://", EndpointHost(spec.server.address), ":", spec.server.port);
}

std::string ServiceStateDir(const ProjectSpec& spec, const Dirs& dirs) {
  return spec.server.state_dir.empty() ? dirs.state + "/service" : spec.server.state_dir;
}

std::string Key(const Fingerprints& keys, const std::string& name) {
  auto it = keys.find(name);
  return it == keys.end() ? "?" : it->second;
}

// How a kit goes into place: the commands of every README's first section.
std::string Untar(const Dirs& dirs, const std::string& kit) {
  const char* sudo = SystemLayout(dirs) ? "sudo " : "";
  return absl::StrCat(sudo, "mkdir -p ", dirs.etc, "\n", sudo, "tar -xzf ", kit, ".tar.gz -C ",
                      dirs.etc, " --no-same-owner\n");
}

// A site kit's key files, as its tarball names them.
std::vector<std::string> KeyFiles(const ProjectSpec& spec, const std::string& site) {
  const std::string dir = "agents/" + site + "/";
  std::vector<std::string> files = {dir + site + ".key", dir + site + ".pub", dir + "server.pub"};
  if (spec.secure_aggregation) files.push_back(dir + "project.pub");
  return files;
}

constexpr char kPackage[] =
    "sudo apt install ./huddle_*_amd64.deb   # /usr/bin/huddle and its systemd units\n";

}  // namespace

std::string EndpointHost(const std::string& host) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return v6 ? "[" + host + "]" : host;
}

std::string OperatorEndpoint(const ProjectSpec& spec) {
  const std::string& bind = spec.server.operator_bind;  // tcp://HOST:PORT, checked
  const size_t colon = bind.rfind(':');
  const std::string host = bind.substr(6, colon - 6);
  const bool any = host == "*" || host == "0.0.0.0" || host == "[::]" || host == "::";
  return absl::StrCat("tcp://", any ? EndpointHost(spec.server.address) : host, bind.substr(colon));
}

std::string ServerYaml(const ProjectSpec& spec, const Dirs& dirs) {
  return absl::StrCat(
      "# server.yaml of project '", spec.project,
      "', written by `huddle provision`: every run writes it again,\n"
      "# so change project.yaml and provision again rather than edit this file.\n",
      "# Run by huddle.service (huddle serve --config ", dirs.etc, "/server.yaml).\n",
      "service:\n",                                                                        //
      "  bind: tcp://", EndpointHost(spec.server.bind_host), ":", spec.server.port, "\n",  //
      "  operator_bind: ", spec.server.operator_bind, "\n",                                //
      "  state_dir: ", ServiceStateDir(spec, dirs), "\n",                                  //
      "security:\n",                                                                       //
      "  server_secret_key: ", dirs.etc, "/keys/server.key\n",                             //
      "  allowed_clients: ", dirs.etc, "/keys/allowed   # the sites' .pub files\n",        //
      "  operators: ", dirs.etc, "/keys/operators   # the operators' .pub files\n",        //
      "http:   # /metrics, /healthz, /readyz\n",                                           //
      "  bind: ", spec.server.http_bind, "\n");
}

std::string AgentYaml(const ProjectSpec& spec, const ProjectSite& site, const Dirs& dirs) {
  const std::string here = absl::StrCat(dirs.etc, "/agents/", site.name);
  std::string out =
      absl::StrCat("# agent.yaml of site '", site.name, "' (project '", spec.project,
                   "'), written by `huddle provision`.\n"
                   "# Run by huddle-agent@",
                   site.name, ".service (huddle agent --config ", here, "/agent.yaml).\n",
                   "coordinator: ", ServiceEndpoint(spec), "\n",    //
                   "client_id: ", site.name, "\n",                  //
                   "security:\n",                                   //
                   "  server_public_key: ", here, "/server.pub\n",  //
                   "  secret_key: ", here, "/", site.name, ".key\n");
  if (spec.secure_aggregation) {
    absl::StrAppend(&out, "  project_public_key: ", here, "/project.pub\n");
  }
  if (!site.device.empty()) absl::StrAppend(&out, "device: ", site.device, "\n");
  if (!site.secure_aggregation_yaml.empty()) {
    absl::StrAppend(&out, "secure_aggregation:\n", Indent(site.secure_aggregation_yaml));
  }
  if (!site.privacy_yaml.empty()) {
    absl::StrAppend(&out, "privacy:\n  ledger: ", dirs.state, "/agents/", site.name,
                    "/privacy.ledger  # never delete it\n", Indent(site.privacy_yaml));
  }
  if (!site.datasets_yaml.empty()) {
    absl::StrAppend(&out, "datasets:\n", Indent(site.datasets_yaml));
  } else {
    absl::StrAppend(
        &out,
        "# TODO: declare this site's data sets here: `huddle agent` refuses to start without\n"
        "# one. A job names the one it trains on (data: {name: ...}); any `data:` keys, e.g.\n"
        "# datasets:\n"
        "#   fmnist: {path: ",
        dirs.state, "/agents/", site.name,
        "/fashion-mnist, partition: iid, num_shards: 3, shard: 0}\n");
  }
  return out;
}

std::string ServerReadme(const ProjectSpec& spec, const Dirs& dirs, const Fingerprints& keys) {
  std::vector<std::string> sites, operators;
  for (const auto& [name, fingerprint] : keys) {
    if (name.rfind("site:", 0) == 0)
      sites.push_back(absl::StrCat(name.substr(5), " (", fingerprint, ")"));
    if (name.rfind("operator:", 0) == 0) {
      operators.push_back(absl::StrCat(name.substr(9), " (", fingerprint, ")"));
    }
  }
  const bool system = SystemLayout(dirs);
  const std::string sudo = system ? "sudo " : "";
  std::string out = absl::StrCat(
      "# Huddle server kit: project `", spec.project, "`\n\n",
      "Written by `huddle provision`. It holds the service's configuration and key pair; its "
      "secret key,\n`keys/server.key`, is in this kit only: keep the tarball as you would the "
      "key.\n\n## Install (the coordinator host)\n\n```sh\n",
      system ? kPackage : "", Untar(dirs, "server"),
      system ? "sudo systemctl enable --now huddle.service\n"
             : absl::StrCat("huddle serve --config ", dirs.etc, "/server.yaml\n"),
      "```\n\n");
  if (!system) {
    absl::StrAppend(&out, "(The systemd units expect ", kSystemEtc, " and ", kSystemState,
                    "; this kit was made for ", dirs.etc, " and ", dirs.state, ".)\n\n");
  }
  absl::StrAppend(
      &out, "The sites connect to `", ServiceEndpoint(spec), "`: open TCP port ", spec.server.port,
      " to them.\nOperators use `", OperatorEndpoint(spec), "`; Prometheus scrapes `http://",
      spec.server.http_bind, "/metrics`.\nJobs, their outputs and the audit log live in `",
      ServiceStateDir(spec, dirs), "`.\n\n## What is in it\n\n| file | what |\n|---|---|\n",
      "| `server.yaml` | the service's config |\n",
      "| `keys/server.key` | the service's secret key (0600) |\n",
      "| `keys/server.pub` | its public key, ", Key(keys, "server"),
      ": every site and operator kit pins it |\n", "| `keys/allowed/` | the enrolled sites: ",
      sites.empty() ? "none yet" : absl::StrJoin(sites, ", "), " |\n",
      "| `keys/operators/` | the enrolled operators: ",
      operators.empty() ? "none" : absl::StrJoin(operators, ", "), " |\n\n",
      "## After a site is added, rotated or removed (or an operator)\n\n"
      "`huddle provision` writes this kit again with the current allow-list. Install the lists "
      "alone\n(`--recursive-unlink` replaces the directories, so a removed site's key goes too) "
      "and have the\nservice read them again (it also does when it sees them change):\n\n```sh\n",
      sudo, "tar -xzf server.tar.gz -C ", dirs.etc,
      " --no-same-owner --recursive-unlink keys/allowed keys/operators\n",
      system ? "sudo systemctl reload huddle.service    # SIGHUP\n"
             : "kill -HUP SERVE_PID                     # the `huddle serve` process\n",
      "```\n\nA removed site's key is refused from then on, its live connection included, "
      "and so is a rotated\nsite's old key (a connection stays only while the key it was "
      "admitted with is enrolled).\nA new site's key is admitted as soon as the lists are in "
      "place.\n");
  return out;
}

std::string SiteReadme(const ProjectSpec& spec, const ProjectSite& site, const Dirs& dirs,
                       const Fingerprints& keys) {
  const bool system = SystemLayout(dirs);
  const std::string here = absl::StrCat(dirs.etc, "/agents/", site.name);
  const std::string unit = absl::StrCat("huddle-agent@", site.name, ".service");
  std::string out = absl::StrCat(
      "# Huddle site kit: `", site.name, "` (project `", spec.project, "`)\n\n",
      "Written by `huddle provision`. It holds this site's agent config and key pair; its secret "
      "key,\n`agents/",
      site.name, "/", site.name,
      ".key`, is in this kit only: keep the tarball as you would the key.\n\n"
      "## Install (this site's host)\n\n```sh\n",
      system ? kPackage : "", Untar(dirs, site.name),
      system ? absl::StrCat("sudo systemctl enable --now ", unit, "\n")
             : absl::StrCat("huddle agent --config ", here, "/agent.yaml\n"),
      "```\n\n");
  if (!system) {
    absl::StrAppend(&out, "(The systemd units expect ", kSystemEtc, " and ", kSystemState,
                    "; this kit was made for ", dirs.etc, " and ", dirs.state, ".)\n\n");
  }
  if (site.datasets_yaml.empty()) {
    absl::StrAppend(&out, "**Before starting the agent**, declare this site's data sets in `", here,
                    "/agent.yaml`\n(`datasets:`, see the commented example there): the agent "
                    "refuses to start without one.\n\n");
  }
  absl::StrAppend(
      &out, "## Data\n\n", "The agent trains on the data sets of `agent.yaml` (`datasets:`).\n",
      system ? absl::StrCat("Its unit runs as a dynamic user that can read nothing of yours: "
                            "the data must be\nworld-readable (`chmod -R o+rX DIR`), or placed "
                            "under `",
                            dirs.state, "/agents/", site.name, "/`,\nthe unit's own directory.\n\n")
             : "The user that runs it must be able to read the data.\n\n",
      "## Identity\n\n", "- connects to `", ServiceEndpoint(spec), "` as `", site.name,
      "`, its key ", Key(keys, "site:" + site.name), "\n", "- pins the service's key ",
      Key(keys, "server"), " (`server.pub`)\n");
  if (spec.secure_aggregation) {
    absl::StrAppend(&out, "- pins the project key ", Key(keys, "project"),
                    " (`project.pub`) for secure aggregation; its own key is\n"
                    "  certified by it\n");
  }
  if (!site.privacy_yaml.empty()) {
    absl::StrAppend(&out, "- keeps its privacy ledger in `", dirs.state, "/agents/", site.name,
                    "/privacy.ledger`: never delete it\n");
  }
  const std::string sudo = system ? "sudo " : "";
  absl::StrAppend(
      &out, "\n## A new kit (the site's key rotated)\n\n", "It installs the same way, then ",
      system ? absl::StrCat("`sudo systemctl restart ", unit, "`") : "restart the agent",
      "; the service refuses the old key\nfrom then on. It replaces `agent.yaml` too: if you "
      "edited it here, unpack the keys alone:\n\n```sh\n",
      sudo, "tar -xzf ", site.name, ".tar.gz -C ", dirs.etc, " --no-same-owner \\\n    ",
      absl::StrJoin(KeyFiles(spec, site.name), " "), "\n```\n",
      system ? absl::StrCat("\nLogs: `journalctl -u ", unit, "`.\n") : "");
  return out;
}

std::string OperatorReadme(const ProjectSpec& spec, const std::string& name, const Dirs& dirs,
                           const Fingerprints& keys) {
  const std::string here = absl::StrCat(dirs.etc, "/operators/", name);
  const std::string endpoint = OperatorEndpoint(spec);
  const bool loopback = endpoint.find("://127.") != std::string::npos ||
                        endpoint.find("://[::1]") != std::string::npos ||
                        endpoint.find("://localhost") != std::string::npos;
  const std::string sudo = SystemLayout(dirs) ? "sudo " : "";
  std::string out = absl::StrCat(
      "# Huddle operator kit: `", name, "` (project `", spec.project, "`)\n\n",
      "Written by `huddle provision`. It holds this operator's key pair (an operator key: "
      "enrolled in the\nservice's operators' list, never an agent); its secret key, `operators/",
      name, "/", name, ".key`,\nis in this kit only.\n\n## Install\n\n```sh\n",
      Untar(dirs, "operator-" + name), "```\n\n");
  if (!sudo.empty()) {
    absl::StrAppend(&out,
                    "The key is then root's (0600): run the commands below with sudo, or unpack "
                    "the kit as yourself\ninto `~/.huddle` (`mkdir -p ~/.huddle && tar -xzf "
                    "operator-",
                    name, ".tar.gz -C ~/.huddle`) and use\nthose paths.\n\n");
  }
  absl::StrAppend(&out, "## Commands\n\n```sh\nOP=\"--service ", endpoint, " --server-key ", here,
                  "/server.pub --key ", here, "/", name, ".key\"\n",
                  "huddle jobs $OP                 # every job: state, round, epsilon\n",
                  "huddle submit job.yaml $OP      # a job names its data set: data: {name: ...}\n",
                  "huddle status JOB $OP\nhuddle logs JOB --follow $OP\nhuddle stop JOB $OP\n",
                  "huddle clients $OP              # the agents: live, last seen, job\n```\n\n",
                  "The service's key is ", Key(keys, "server"), "; this operator's ",
                  Key(keys, "operator:" + name), ".\n");
  if (loopback) {
    absl::StrAppend(&out,
                    "The operators' endpoint listens on the server's loopback only: run "
                    "the commands there, or\nforward it first: `ssh -N -L ",
                    endpoint.substr(endpoint.rfind(':') + 1), ":", endpoint.substr(6), " ",
                    spec.server.address, "`.\n");
  }
  return out;
}

std::string ProjectReadme(const ProjectSpec& spec, const Fingerprints& keys) {
  std::vector<std::string> sites;
  for (const auto& [name, fingerprint] : keys) {
    if (name.rfind("site:", 0) == 0) sites.push_back(name.substr(5));
  }
  return absl::StrCat(
      "# Huddle project key: `", spec.project, "`\n\n",
      "For the privacy owner. The project key (signing key ", Key(keys, "project"),
      ") certifies each site's\nkey for secure aggregation, and every site pins `project.pub`: "
      "a member accepts only peers it\ncertified, so the coordinator can neither invent members "
      "nor substitute keys. Keep\n`project/project.key` away from the coordinator host and its "
      "operators (docs/security.md):\nwhoever holds it together with the coordinator could "
      "certify puppets.\n\n",
      "`huddle provision` certified the sites of this store with it (no expiry): ",
      sites.empty() ? "none yet" : absl::StrJoin(sites, ", "),
      ".\nNothing here is installed on a server: keep this kit on the privacy owner's machine. "
      "The store\nof `huddle provision` holds the key as well, so provision there, not on the "
      "coordinator host.\nA site key certified by hand:\n\n```sh\n"
      "huddle certify --project project/project.key SITE.pub\n```\n");
}

}  // namespace huddle::cli::provision
