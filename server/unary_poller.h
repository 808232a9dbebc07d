// UnaryPoller: unary gRPC methods served from the async completion-queue
// API by a fixed set of worker threads (kvbrokerd --server_threading=poller).
//
// The workers poll one ServerCompletionQueue; every call a worker takes off
// it is handled inline on that thread (parse, handler, serialize, Finish),
// so a call costs the wake-up of the thread that polled its bytes in,
// instead of the callback server's hand-offs between its threads. Each
// method keeps one outstanding request per worker, posted again as soon as
// a call of it arrives; calls beyond those wait in gRPC's queue of
// unmatched calls.
//
// One queue for all workers, not one each: gRPC matches an arriving call to
// any outstanding request, and a worker blocked in a handler (an Alloc
// mapping pages holds its pool's lock for milliseconds) would strand the
// calls matched to requests on its own queue. With one queue a call waits
// only while every worker is busy.
//
// Methods are served raw (grpc::ByteBuffer in and out): the handler parses
// the request itself, so that a request that does not parse gets the typed
// refusal of unparsable_request.h rather than gRPC's bare INTERNAL.
//
// Order (daemon.cc):
//   UnaryPoller poller(&builder, workers, methods);  // adds the queue
//   server = builder.BuildAndStart();
//   poller.Start();                                   // requests, workers
//   ...
//   server->Shutdown(deadline); server->Wait();       // every call finished
//   poller.Shutdown();                                // queue drained
//   server.reset(); then the poller                   // the queue outlives it
// The server's Shutdown returns only once every call it handed out has been
// finished and released, so no call is requested or finished on the queue
// after it shut down (Post checks it as well).
//
// Thread safety: Start and Shutdown from the owning thread; the rest runs
// on the workers.

#ifndef KVBROKER_SERVER_UNARY_POLLER_H_
#define KVBROKER_SERVER_UNARY_POLLER_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/async_unary_call.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvbroker {

class UnaryPoller {
 public:
  using Writer = grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>;
  struct Method {
    // "/package.Service/Method".
    std::string name;
    // Asks gRPC for the next call of the method on `cq`, announced with
    // `tag` (the service's raw RequestAsyncUnary).
    std::function<void(grpc::ServerContext* ctx, grpc::ByteBuffer* request,
                       Writer* writer, grpc::ServerCompletionQueue* cq,
                       void* tag)>
        request;
    // Runs one call: parses `request` (consumed), fills `response` and
    // returns the status the call ends with (`response` is sent only with
    // OK).
    std::function<grpc::Status(grpc::ServerContext* ctx,
                               grpc::ByteBuffer* request,
                               grpc::ByteBuffer* response)>
        handle;
  };

  // Adds the completion queue to `builder`, which must not be built yet.
  // `workers`: threads, at least 1.
  UnaryPoller(grpc::ServerBuilder* builder, int workers,
              std::vector<Method> methods);
  // Shuts down (see Shutdown) if that was not done.
  ~UnaryPoller();

  UnaryPoller(const UnaryPoller&) = delete;
  UnaryPoller& operator=(const UnaryPoller&) = delete;

  // After the server started: requests `workers` calls of every method and
  // starts the workers.
  void Start();

  // After the server's Shutdown returned: shuts the queue down, lets the
  // workers drain it and joins them. Idempotent.
  void Shutdown();

  const std::vector<Method>& methods() const { return methods_; }

 private:
  struct Call;

  // Requests the next call of `method`, unless the queue shut down.
  void Post(const Method& method) ABSL_LOCKS_EXCLUDED(mu_);
  void Run();

  const std::vector<Method> methods_;
  const int workers_;
  const std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  // Set just before cq_ shuts down; nothing is requested on cq_ afterwards.
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_UNARY_POLLER_H_
