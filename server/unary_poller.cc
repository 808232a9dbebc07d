// UnaryPoller: the workers' loop and the life of one call; see
// unary_poller.h.

#include "server/unary_poller.h"

#include <algorithm>
#include <utility>

namespace kvbroker {

// One call of one method: requested, then (once gRPC announced it) handled
// and finished; deleted when the finish is reported or the request fails
// (the server shut down).
struct UnaryPoller::Call {
  explicit Call(const Method* m) : method(m), writer(&ctx) {}
  const Method* const method;
  grpc::ServerContext ctx;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  Writer writer;
  bool finishing = false;
};

UnaryPoller::UnaryPoller(grpc::ServerBuilder* builder, int workers,
                         std::vector<Method> methods)
    : methods_(std::move(methods)),
      workers_(std::max(workers, 1)),
      cq_(builder->AddCompletionQueue()) {}

UnaryPoller::~UnaryPoller() { Shutdown(); }

void UnaryPoller::Start() {
  for (int i = 0; i < workers_; ++i) {
    for (const Method& method : methods_) Post(method);
  }
  for (int i = 0; i < workers_; ++i) threads_.emplace_back([this] { Run(); });
}

void UnaryPoller::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    cq_->Shutdown();
  }
  if (threads_.empty()) Run();  // never started: drain the queue here
  for (std::thread& thread : threads_) thread.join();
}

void UnaryPoller::Post(const Method& method) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  Call* call = new Call(&method);
  method.request(&call->ctx, &call->request, &call->writer, cq_.get(), call);
}

void UnaryPoller::Run() {
  void* tag;
  bool ok;
  while (cq_->Next(&tag, &ok)) {
    Call* call = static_cast<Call*>(tag);
    if (call->finishing || !ok) {
      delete call;
      continue;
    }
    Post(*call->method);
    call->finishing = true;
    const grpc::Status status =
        call->method->handle(&call->ctx, &call->request, &call->response);
    call->writer.Finish(call->response, status, call);
  }
}

}  // namespace kvbroker
