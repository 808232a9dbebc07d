/* kvbroker_engine.h: the C ABI of libkvbroker_engine.so, the engine side of
 * kvbrokerd's attach socket (SPEC section 10). An inference engine connects,
 * attaches to a pool, gets the pool's pages mapped into its own address space
 * (host memory or CUDA device memory), and allocates and frees KV blocks on
 * its session. Python's kvbroker.engine is written over this ABI with ctypes.
 *
 * Layout: block b, layer l, buffer k of session device i starts at
 *   base(i) + b * block_stride_bytes + l * layer_offset_bytes
 *           + k * buffer_offset_bytes
 * (kvb_block_address computes it), so a layer's K (k = 0) or V (k = 1) over
 * every block is one strided view: stride block_stride_bytes, block_bytes
 * contiguous bytes per block.
 *
 * Errors: every function that can fail returns a google.rpc.Code (0 = OK)
 * and, when `err` is not NULL, fills it: the daemon's typed reason (the
 * kvbroker.v1.Reason value and name, e.g. POOL_EXHAUSTED) or the protocol
 * error (kvbroker.attach.v1.ProtocolError, e.g. UNEXPECTED_FDS) and a
 * message. Strings in kvb_error are always NUL-terminated.
 *
 * Ownership: kvb_connect returns a session the caller owns; kvb_close ends
 * it and frees it (afterwards the pointer is invalid). Mapped memory belongs
 * to the session: addresses stay valid until the page is revoked (the revoke
 * callback names it) or the session is closed. Strings and arrays passed in
 * are only read during the call.
 *
 * Threading: a session may be used from any thread; its calls are
 * serialised internally, except kvb_close, which must be the session's last
 * call and must not overlap any other (the caller orders them). Revocations are
 * handled inside any call that reads the socket; between calls, poll
 * kvb_event_fd for readability and call kvb_process_events (no polling in the
 * hot loop is needed). The revoke callback runs on the thread of that call,
 * after the pages were unmapped, and must not call into the same session.
 *
 * Stability: only the kvb_ symbols are exported; kvb_abi_version() changes
 * when this ABI does. */

#ifndef KVBROKER_ENGINE_KVBROKER_ENGINE_H_
#define KVBROKER_ENGINE_KVBROKER_ENGINE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVB_ENGINE_ABI_VERSION 4

/* The longest request or reservation id a session takes, in bytes; a buffer
 * that receives a reservation id needs one byte more. (ABI version 4) */
#define KVB_MAX_ID_LENGTH 128

typedef struct kvb_session kvb_session;

typedef struct kvb_error {
  int32_t code;           /* google.rpc.Code; 0 when OK */
  int32_t reason;         /* kvbroker.v1.Reason value; 0 if none */
  int32_t protocol_error; /* kvbroker.attach.v1.ProtocolError; 0 if none */
  char reason_name[64];   /* the reason's or protocol error's name, or "" */
  char message[512];
} kvb_error;

typedef struct kvb_layout {
  int64_t virtual_bytes_per_device;
  int64_t bundle_bytes;
  int64_t block_stride_bytes;
  int64_t layer_offset_bytes;
  int64_t buffer_offset_bytes;
  int64_t page_size;
  int64_t block_bytes;
  int64_t num_layers;
  int64_t num_kv_buffers;
  int64_t page_count;
  int64_t max_blocks;
  int64_t tokens_per_block;
  int32_t device_count; /* session devices */
  int32_t is_cuda;      /* 1: device memory (CUDA); 0: host memory */
} kvb_layout;

/* Where the last successful kvb_attach's time went, wall-clock nanoseconds.
 * import, map and set_access are the driver's calls (mmap and mprotect on
 * the host backend; import is 0 there), summed over the session devices;
 * receive is the wait for the daemon's reply and page frames (its exports,
 * when the pool does not export at map time, and the transfer); setup the
 * mappers' creation. All zero before an attach. (ABI version 2) */
typedef struct kvb_attach_stats {
  int64_t pages;
  int64_t frames;
  int64_t set_access_calls;
  int64_t total_ns;
  int64_t receive_ns;
  int64_t setup_ns;
  int64_t import_ns;
  int64_t map_ns;
  int64_t set_access_ns;
} kvb_attach_stats;

/* Called with the page ids of a revocation, after they were unmapped. */
typedef void (*kvb_revoke_callback)(void* user, const int64_t* page_ids,
                                    int64_t count);

int32_t kvb_abi_version(void);

/* Connects to `socket_path` and says hello as `holder` with `token` (may be
 * "" or NULL without --auth_tokens). With a grace > 0 the daemon keeps the
 * holder's blocks that long after the connection drops. */
int32_t kvb_connect(const char* socket_path, const char* token,
                    const char* holder, int64_t reattach_grace_ms,
                    kvb_session** out, kvb_error* err);

/* Attaches to `pool` and maps its pages on `devices` (pool device ordinals;
 * NULL or 0 of them: all). A non-empty reservation_id redeems that many
 * reserved blocks; *redeemed (if not NULL) receives how many blocks the
 * holder now owns after the attach. A refusal by the daemon (e.g.
 * POOL_NOT_FOUND) leaves the session as it was; any other failure (a page
 * or a backend that cannot be mapped here, a malformed reply, no reply in
 * time) closes the session, with that failure's code, since the daemon may
 * have attached it already: only kvb_close remains to be called. */
int32_t kvb_attach(kvb_session* s, const char* pool, const int32_t* devices,
                   int32_t num_devices, const char* reservation_id,
                   int64_t reservation_blocks, int64_t* held_blocks,
                   kvb_error* err);

int32_t kvb_get_layout(kvb_session* s, kvb_layout* out, kvb_error* err);
/* Session device `index`: its pool ordinal, base address and UUID. */
int32_t kvb_device(kvb_session* s, int32_t index, int32_t* ordinal,
                   uint64_t* base, char* uuid, size_t uuid_size,
                   kvb_error* err);
int32_t kvb_block_address(kvb_session* s, int32_t device_index, int64_t block,
                          int64_t layer, int64_t buffer, uint64_t* out,
                          kvb_error* err);
/* Pages mapped now on every session device. */
int64_t kvb_mapped_pages(kvb_session* s);
int32_t kvb_get_attach_stats(kvb_session* s, kvb_attach_stats* out,
                             kvb_error* err);

/* Allocates `num_blocks` blocks (all or nothing) into block_ids, which has
 * room for `capacity` ids (INVALID_ARGUMENT, nothing allocated, when it has
 * not). `request_id` (may be NULL) makes a retry return the first outcome. */
int32_t kvb_alloc(kvb_session* s, int64_t num_blocks, const char* request_id,
                  int64_t* block_ids, int64_t capacity, int64_t* allocated,
                  kvb_error* err);
/* kvb_alloc taking the blocks of `reservation_id` first (a reservation made
 * by kvb_reserve on any session, or over gRPC by a scheduler), then
 * available ones: the blocks are this holder's, and what the call did not
 * need stays reserved. A used-up reservation lives on, empty, until it is
 * released or expires. RESERVATION_TOO_SMALL when it and the pool's
 * available blocks cannot cover `num_blocks`, RESERVATION_NOT_FOUND /
 * RESERVATION_EXPIRED as the names say; nothing is allocated on any
 * refusal. (ABI version 4) */
int32_t kvb_alloc_reserved(kvb_session* s, int64_t num_blocks,
                           const char* reservation_id, const char* request_id,
                           int64_t* block_ids, int64_t capacity,
                           int64_t* allocated, kvb_error* err);
/* Sets `num_blocks` (> 0) mapped blocks aside for `ttl_ms` milliseconds (0:
 * the daemon's default, 30 s), all or nothing: from then on they count as
 * reserved, not available, until kvb_alloc_reserved takes them,
 * kvb_release_reservation returns them or the reservation expires. The
 * reservation's id is written NUL-terminated to `reservation_id`, which has
 * room for `reservation_id_size` bytes and must have room for
 * KVB_MAX_ID_LENGTH + 1 (INVALID_ARGUMENT, nothing sent, when it has not).
 * *reserved receives the blocks set aside and *expire_unix_ns their expiry
 * (nanoseconds since the Unix epoch; INT64_MAX or INT64_MIN for one that
 * int64 nanoseconds cannot hold), each when not NULL. A `request_id`
 * makes a retry answer the first reservation. (ABI version 4) */
int32_t kvb_reserve(kvb_session* s, int64_t num_blocks, int64_t ttl_ms,
                    const char* request_id, char* reservation_id,
                    size_t reservation_id_size, int64_t* reserved,
                    int64_t* expire_unix_ns, kvb_error* err);
/* Ends a reservation, returning the blocks still in it to the pool;
 * *released (if not NULL) receives how many (0 for a used-up one).
 * RESERVATION_NOT_FOUND for an unknown or released id,
 * RESERVATION_EXPIRED for an expired one. (ABI version 4) */
int32_t kvb_release_reservation(kvb_session* s, const char* reservation_id,
                                int64_t* released, kvb_error* err);
/* Frees blocks this holder owns, all or nothing. */
int32_t kvb_free(kvb_session* s, const int64_t* block_ids, int64_t count,
                 const char* request_id, int64_t* freed, kvb_error* err);
int32_t kvb_capacity(kvb_session* s, int64_t* available_blocks,
                     int64_t* allocated_blocks, int64_t* reserved_blocks,
                     kvb_error* err);

/* How long each call polls the socket for the daemon's reply before it
 * sleeps: 0 (the default) sleeps at once; a few tens of microseconds spare
 * the calling thread a sleep and a wake per reply at the price of its CPU
 * while it waits. INVALID_ARGUMENT for a negative value. (ABI version 3) */
int32_t kvb_set_reply_spin(kvb_session* s, int64_t spin_ns, kvb_error* err);

/* How long each call waits for the daemon's reply before it returns
 * DEADLINE_EXCEEDED (4); the default is 30 s, 0 waits forever. The call's
 * outcome is then unknown (retry with the same request_id to learn it) and
 * its late reply is dropped; a kvb_attach that runs out of time closes the
 * session. The same bound applies to sending, which waits only while the
 * daemon reads nothing: a send that times out returns DEADLINE_EXCEEDED and
 * closes the session. INVALID_ARGUMENT for a negative value. (ABI version
 * 4) */
int32_t kvb_set_call_timeout(kvb_session* s, int64_t timeout_ns,
                             kvb_error* err);

/* Readable when the daemon sent something; then call kvb_process_events. */
int32_t kvb_event_fd(kvb_session* s);
int32_t kvb_process_events(kvb_session* s, kvb_error* err);
void kvb_set_revoke_callback(kvb_session* s, kvb_revoke_callback callback,
                             void* user);

/* Ends the session (release != 0: the holder's blocks are freed now; else
 * its grace applies), unmaps everything and frees `s`. Waits up to 5 seconds,
 * sending included, for the daemon to confirm the end: on OK the holder's
 * blocks are already freed or parked, so a kvb_connect with the same holder
 * right after it is never refused with HOLDER_BUSY. DEADLINE_EXCEEDED when no
 * confirmation came (`s` is freed all the same). No other call on `s` may be in
 * flight or follow, from any thread: kvb_close frees the session those calls
 * would use. */
int32_t kvb_close(kvb_session* s, int32_t release, kvb_error* err);

#ifdef __cplusplus
}
#endif

#endif /* KVBROKER_ENGINE_KVBROKER_ENGINE_H_ */
