// Request bytes that do not parse as the method's request message, sent
// over real channels (TCP and the Unix socket) with grpc::GenericStub: every
// method, unary and streaming, refuses them with a typed INVALID_ARGUMENT
// (ErrorInfo domain "kvbroker", the method named) and nothing changes; a
// method the daemon lacks is still UNIMPLEMENTED.

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "client/error_codec.h"
#include "gtest/gtest.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace testing {
namespace {

constexpr char kService[] = "/kvbroker.v1.KvBroker/";

// Bytes no message parses: a varint that never ends, a length past the
// end, a group never closed.
const std::vector<std::string>& Garbage() {
  static const std::vector<std::string> kGarbage = {
      std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
      std::string("\x0a\x7f\x61", 3),
      std::string("\x0b", 1),
  };
  return kGarbage;
}

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::Status GenericUnary(grpc::GenericStub& stub, const std::string& method,
                          const std::string& bytes) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const grpc::ByteBuffer request = Buffer(bytes);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  return status;
}

// A server-streaming call through the generic (bidi) stub: one message,
// then the status.
grpc::Status GenericStream(grpc::GenericStub& stub, const std::string& method,
                           const std::string& bytes) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&ctx, method, &cq);
  void* tag;
  bool ok;
  int next = 1;
  auto step = [&] {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, reinterpret_cast<void*>(next));
    ++next;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  step();
  call->Write(Buffer(bytes), reinterpret_cast<void*>(2));
  step();
  call->WritesDone(reinterpret_cast<void*>(3));
  step();
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(4));
  step();
  EXPECT_FALSE(ok) << "a reply to an unparsable request";
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

void ExpectTypedRefusal(const grpc::Status& status, const std::string& method,
                        size_t garbage) {
  SCOPED_TRACE(method + ", garbage #" + std::to_string(garbage));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message();
  const std::optional<KvbError> e = DecodeError(status);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->reason, v1::INVALID_ARGUMENT);
  EXPECT_EQ(e->metadata.at("method"), method);
  EXPECT_EQ(e->metadata.at("field"), "request");
  ASSERT_EQ(e->field_violations.size(), 1u);
  EXPECT_EQ(e->field_violations[0].field(), "request");
}

class UnparsableRequest : public ::testing::TestWithParam<Transport> {};

INSTANTIATE_TEST_SUITE_P(Transports, UnparsableRequest,
                         ::testing::Values(Transport::kTcp, Transport::kUnix),
                         TransportName);

TEST_P(UnparsableRequest, EveryMethodRefusesItTypedAndChangesNothing) {
  Rig rig;
  ASSERT_NE(rig.daemon, nullptr);
  std::shared_ptr<grpc::Channel> channel = rig.Channel(GetParam());
  Client c(channel);
  ASSERT_TRUE(c.CreatePool(Spec("p", MiB(2), MiB(1), 8)).ok());
  ASSERT_TRUE(c.Alloc("p", 3).ok());
  const Reply<v1::CapacityResponse> before = c.Capacity("p");
  ASSERT_TRUE(before.ok());
  const int64_t creates = rig.backend.calls(BackendOp::kCreate);

  grpc::GenericStub stub(channel);
  const std::vector<std::string> unary = {"CreatePool",
                                          "GetPool",
                                          "ListPools",
                                          "DeletePool",
                                          "Capacity",
                                          "Alloc",
                                          "Free",
                                          "Reserve",
                                          "Trim",
                                          "SetMemoryLimit",
                                          "ReleaseReservation",
                                          "GetPageOccupancy"};
  for (const std::string& name : unary) {
    for (size_t g = 0; g < Garbage().size(); ++g) {
      ExpectTypedRefusal(GenericUnary(stub, kService + name, Garbage()[g]),
                         kService + name, g);
    }
  }
  for (size_t g = 0; g < Garbage().size(); ++g) {
    ExpectTypedRefusal(
        GenericStream(stub, std::string(kService) + "WatchCapacity",
                      Garbage()[g]),
        std::string(kService) + "WatchCapacity", g);
  }

  // Nothing changed, and the pool still serves well-formed calls.
  const Reply<v1::CapacityResponse> after = c.Capacity("p");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after.response.capacity().DebugString(),
            before.response.capacity().DebugString());
  EXPECT_EQ(rig.backend.calls(BackendOp::kCreate), creates);
  EXPECT_TRUE(c.Alloc("p", 1).ok());

  // A well-formed request through the generic stub is served as usual.
  v1::CapacityRequest good;
  good.set_pool("p");
  EXPECT_TRUE(GenericUnary(stub, std::string(kService) + "Capacity",
                           good.SerializeAsString())
                  .ok());
  // A method the daemon does not serve stays UNIMPLEMENTED.
  EXPECT_EQ(
      GenericUnary(stub, std::string(kService) + "Nonexistent", Garbage()[0])
          .error_code(),
      grpc::StatusCode::UNIMPLEMENTED);
}

}  // namespace
}  // namespace testing
}  // namespace kvbroker
