// The C++ example of README.md's "Engines" section, built and run by
// //engine:engine_py_test, which also checks that the README shows exactly
// the lines between the README markers below.
//
// Usage: readme_example SOCKET TOKEN

#include <cstdio>

#include "absl/status/status.h"
#include "engine/session.h"

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "%s\n", status.ToString().c_str());
  return 1;
}

int Run(const char* socket_path, const char* token) {
  // README:begin
  kvbroker::engine::ConnectOptions connect;
  connect.socket_path = socket_path;
  connect.holder = "example-rank0";
  connect.token = token;
  auto session = kvbroker::engine::Session::Connect(connect);
  if (!session.ok()) return Fail(session.status());

  kvbroker::engine::AttachOptions attach;
  attach.pool = "kv";
  if (auto r = (*session)->Attach(attach); !r.ok()) return Fail(r.status());

  auto blocks = (*session)->Alloc(4);  // owned by "example-rank0"
  if (!blocks.ok()) return Fail(blocks.status());
  // V (buffer 1) of layer 1 of the first block, on session device 0.
  auto v = (*session)->BlockAddress(0, (*blocks)[0], 1, 1);
  std::printf("%zu blocks; V of layer 1 of block %ld at base + %lu\n",
              blocks->size(), static_cast<long>((*blocks)[0]),
              static_cast<unsigned long>(*v - (*session)->device_base(0)));
  if (auto f = (*session)->Free(*blocks); !f.ok()) return Fail(f.status());
  return (*session)->Close().ok() ? 0 : 1;
  // README:end
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s SOCKET TOKEN\n", argv[0]);
    return 2;
  }
  return Run(argv[1], argv[2]);
}
