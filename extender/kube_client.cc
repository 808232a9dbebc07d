// libcurl side of KubeClient: one easy handle per request (the extender
// calls the API on bind and on broker refreshes, not per filtered node).

#include "extender/kube_client.h"

#include <curl/curl.h>

#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "extender/extender_api.h"

namespace kvbroker {
namespace extender {

using nlohmann::json;

namespace {

size_t Append(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::UnauthenticatedError(
        absl::StrCat("cannot read the token file ", path));
  }
  std::stringstream s;
  s << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(s.str()));
}

std::string Escape(const std::string& segment) {
  char* e = curl_easy_escape(nullptr, segment.c_str(),
                             static_cast<int>(segment.size()));
  std::string out = e != nullptr ? e : "";
  curl_free(e);
  return out;
}

std::string PodPath(const std::string& ns, const std::string& name) {
  return absl::StrCat("/api/v1/namespaces/", Escape(ns), "/pods/",
                      Escape(name));
}

absl::Status FromHttp(long code, const std::string& what,
                      const std::string& body) {
  absl::StatusOr<json> doc = ParseJson(body, what);
  std::string message = body.substr(0, 512);
  if (doc.ok() && doc->is_object() && doc->contains("message") &&
      (*doc)["message"].is_string()) {
    message = (*doc)["message"].get<std::string>();
  }
  const std::string text = absl::StrCat(what, ": HTTP ", code, ": ", message);
  switch (code) {
    case 400:
    case 422: return absl::InvalidArgumentError(text);
    case 401: return absl::UnauthenticatedError(text);
    case 403: return absl::PermissionDeniedError(text);
    case 404: return absl::NotFoundError(text);
    case 409: return absl::AlreadyExistsError(text);
    case 410: return absl::FailedPreconditionError(text);
    case 429: return absl::UnavailableError(text);
    default:
      return code >= 500 ? absl::UnavailableError(text)
                         : absl::UnknownError(text);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<KubeClient>> KubeClient::Create(
    KubeClientOptions options) {
  if (!absl::StartsWith(options.api_server, "https://") &&
      !absl::StartsWith(options.api_server, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Kubernetes API server \"", options.api_server,
                     "\" must be an http:// or https:// URL"));
  }
  while (absl::EndsWith(options.api_server, "/")) {
    options.api_server.pop_back();
  }
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  return std::unique_ptr<KubeClient>(new KubeClient(std::move(options)));
}

absl::StatusOr<json> KubeClient::Request(const std::string& method,
                                         const std::string& path,
                                         const std::string& content_type,
                                         const std::string& body) const {
  const std::string what = absl::StrCat(method, " ", path);
  std::string token;
  if (!options_.token_file.empty()) {
    absl::StatusOr<std::string> t = ReadToken(options_.token_file);
    if (!t.ok()) return t.status();
    token = *std::move(t);
  }
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Accept: application/json");
  if (!token.empty()) {
    headers = curl_slist_append(
        headers, absl::StrCat("Authorization: Bearer ", token).c_str());
  }
  if (!content_type.empty()) {
    headers = curl_slist_append(
        headers, absl::StrCat("Content-Type: ", content_type).c_str());
  }
  std::string reply;
  const std::string url = options_.api_server + path;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(
      curl, CURLOPT_TIMEOUT_MS,
      static_cast<long>(absl::ToInt64Milliseconds(options_.timeout)));
  if (!options_.ca_file.empty()) {
    curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());
  }
  if (!body.empty()) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE,
                     static_cast<long>(body.size()));
  }
  const CURLcode rc = curl_easy_perform(curl);
  long code = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) {
    return absl::UnavailableError(
        absl::StrCat(what, ": ", curl_easy_strerror(rc)));
  }
  if (code < 200 || code > 299) return FromHttp(code, what, reply);
  absl::StatusOr<json> doc = ParseJson(reply, what);
  if (!doc.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the API server's reply: ", doc.status().message()));
  }
  return doc;
}

absl::StatusOr<json> KubeClient::GetPod(const std::string& ns,
                                        const std::string& name) const {
  return Request("GET", PodPath(ns, name), "", "");
}

absl::StatusOr<json> KubeClient::ListPods(
    const std::string& ns, const std::string& label_selector, int limit,
    const std::string& continue_token) const {
  std::string path =
      absl::StrCat("/api/v1/namespaces/", Escape(ns),
                   "/pods?labelSelector=", Escape(label_selector));
  if (limit > 0) absl::StrAppend(&path, "&limit=", limit);
  if (!continue_token.empty()) {
    absl::StrAppend(&path, "&continue=", Escape(continue_token));
  }
  return Request("GET", path, "", "");
}

absl::StatusOr<json> KubeClient::PatchPodAnnotations(
    const std::string& ns, const std::string& name,
    const std::map<std::string, std::optional<std::string>>& annotations,
    const std::string& resource_version) const {
  json values = json::object();
  for (const auto& [key, value] : annotations) {
    values[key] = value.has_value() ? json(*value) : json(nullptr);
  }
  json patch = {{"metadata", {{"annotations", values}}}};
  if (!resource_version.empty()) {
    patch["metadata"]["resourceVersion"] = resource_version;
  }
  return Request("PATCH", PodPath(ns, name), "application/merge-patch+json",
                 patch.dump(-1, ' ', false, json::error_handler_t::replace));
}

absl::Status KubeClient::CreateBinding(
    const std::string& ns, const std::string& name, const std::string& uid,
    const std::string& node, const std::string& resource_version) const {
  json binding = {
      {"apiVersion", "v1"},
      {"kind", "Binding"},
      {"metadata", {{"name", name}, {"namespace", ns}, {"uid", uid}}},
      {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}};
  if (!resource_version.empty()) {
    binding["metadata"]["resourceVersion"] = resource_version;
  }
  return Request("POST", PodPath(ns, name) + "/binding", "application/json",
                 binding.dump(-1, ' ', false, json::error_handler_t::replace))
      .status();
}

}  // namespace extender
}  // namespace kvbroker
