"""kvbroker.engine: an inference engine's side of kvbrokerd's attach socket.

Pure Python over the C ABI of libkvbroker_engine.so (engine/kvbroker_engine.h)
with ctypes, so it loads into any Python 3 without being compiled against it
and needs neither grpcio nor numpy (numpy and torch are only consumers of the
views it returns).

    from kvbroker.engine import Session
    with Session("/run/kvbroker/attach.sock", holder="rank0") as s:
        s.attach("llama")
        blocks = s.alloc(16)
        k = numpy.asarray(s.kv_view(layer=3, buffer=0, dtype="float16",
                                    block_shape=(16, 8, 128)))
        k[blocks[0]] = 0          # writes the pool's memory, no copy

kv_view(layer, buffer) is one strided view over every block of that layer's
K (buffer 0) or V (buffer 1): shape (max_blocks,) + block_shape, the first
stride block_stride_bytes, the block itself contiguous. It exposes
__array_interface__ on the host backend (numpy.asarray) and
__cuda_array_interface__ on CUDA (torch.as_tensor, cupy). Only blocks on
mapped pages may be touched: the ones this holder allocated always are.

Admission: reserve(n, ttl) sets n mapped blocks aside (no longer
available to anyone) before the engine commits to a request; alloc(n,
reservation_id=r.id) makes them this holder's, release_reservation(r.id)
gives back what is left, and a reservation not released returns its
blocks at its expiry. A reservation a scheduler made over gRPC is
redeemed the same way, or at attach.

The library is found through $KVBROKER_ENGINE_LIBRARY, then beside this
file, then on the loader's search path. Errors raise EngineError with the
daemon's typed reason (reason_name: "POOL_EXHAUSTED", "UNAUTHENTICATED",
"UNEXPECTED_MESSAGE", ...).

Threading: as the C ABI (calls are serialised per session; revocations are
handled inside calls and in process_events(), which an event loop calls when
fileno() is readable). Unlike kvb_close, close() may be called while other
threads use the session: it waits for a call in flight, and later calls
raise EngineError INVALID_ARGUMENT. The revocation callback must not call
into the session.

copy_into(dst, src) copies a torch tensor into a layer view at the bandwidth
of a contiguous copy, where dst.copy_(src) gets about half of it (the view is
strided by the layout; engine/README.md, "Copying into a layer view").
"""

import collections
import ctypes
import os
import threading
import warnings

__all__ = ["EngineError", "Layout", "Reservation", "Session", "KvView",
           "copy_into", "load_library"]

_ABI_VERSION = 4
# KVB_MAX_ID_LENGTH of kvbroker_engine.h.
_MAX_ID_LENGTH = 128
_LIBRARY_NAME = "libkvbroker_engine.so"

# typestr of the element types a view can have (little-endian machines).
_TYPESTRS = {
    "uint8": "|u1", "int8": "|i1", "uint16": "<u2", "int16": "<i2",
    "float16": "<f2", "bfloat16": "<V2", "uint32": "<u4", "int32": "<i4",
    "float32": "<f4", "uint64": "<u8", "int64": "<i8", "float64": "<f8",
}


class _Error(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_int32),
        ("reason", ctypes.c_int32),
        ("protocol_error", ctypes.c_int32),
        ("reason_name", ctypes.c_char * 64),
        ("message", ctypes.c_char * 512),
    ]


class _Layout(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "virtual_bytes_per_device", "bundle_bytes", "block_stride_bytes",
        "layer_offset_bytes", "buffer_offset_bytes", "page_size",
        "block_bytes", "num_layers", "num_kv_buffers", "page_count",
        "max_blocks", "tokens_per_block")] + [
        ("device_count", ctypes.c_int32),
        ("is_cuda", ctypes.c_int32),
    ]


class _AttachStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "pages", "frames", "set_access_calls", "total_ns", "receive_ns",
        "setup_ns", "import_ns", "map_ns", "set_access_ns")]


_REVOKE_CALLBACK = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_int64)


class EngineError(Exception):
    """A failed call: `code` (google.rpc.Code), `reason_name` (the daemon's
    typed reason or the protocol error), `message`."""

    def __init__(self, code, reason, protocol_error, reason_name, message):
        super().__init__("%s (code %d): %s" % (reason_name or "ERROR", code,
                                               message))
        self.code = code
        self.reason = reason
        self.protocol_error = protocol_error
        self.reason_name = reason_name
        self.message = message


Reservation = collections.namedtuple("Reservation",
                                     ("id", "num_blocks", "expire_time"))
Reservation.__doc__ = """Session.reserve's answer: the reservation's id,
the blocks set aside and when they return to the pool unless used or
released (seconds since the Unix epoch)."""


class Layout:
    """Where everything is in a device's range (PoolLayout)."""

    def __init__(self, raw):
        for name, _ in _Layout._fields_:
            setattr(self, name, getattr(raw, name))
        self.is_cuda = bool(raw.is_cuda)

    def __repr__(self):
        return "Layout(%s)" % ", ".join(
            "%s=%r" % (n, getattr(self, n)) for n, _ in _Layout._fields_)


_lib = None


def load_library(path=None):
    """Loads (once) and returns the C library."""
    global _lib
    if _lib is not None and path is None:
        return _lib
    candidates = [path] if path else []
    if os.environ.get("KVBROKER_ENGINE_LIBRARY"):
        candidates.append(os.environ["KVBROKER_ENGINE_LIBRARY"])
    candidates.append(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                   _LIBRARY_NAME))
    candidates.append(_LIBRARY_NAME)
    errors = []
    for candidate in candidates:
        if os.sep in candidate and not os.path.exists(candidate):
            errors.append("%s: no such file" % candidate)
            continue
        try:
            lib = ctypes.CDLL(candidate)
            break
        except OSError as e:
            errors.append(str(e))
    else:
        raise OSError("cannot load %s: %s" % (_LIBRARY_NAME,
                                              "; ".join(errors)))
    _declare(lib)
    if lib.kvb_abi_version() != _ABI_VERSION:
        raise OSError("%s has ABI version %d, this module needs %d" %
                      (candidate, lib.kvb_abi_version(), _ABI_VERSION))
    if path is None:
        _lib = lib
    return lib


def _declare(lib):
    p = ctypes.c_void_p
    i32, i64, u64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64
    err = ctypes.POINTER(_Error)
    pi64 = ctypes.POINTER(i64)
    sigs = {
        "kvb_abi_version": (i32, []),
        "kvb_connect": (i32, [ctypes.c_char_p, ctypes.c_char_p,
                              ctypes.c_char_p, i64, ctypes.POINTER(p), err]),
        "kvb_attach": (i32, [p, ctypes.c_char_p, ctypes.POINTER(i32), i32,
                             ctypes.c_char_p, i64, pi64, err]),
        "kvb_get_layout": (i32, [p, ctypes.POINTER(_Layout), err]),
        "kvb_device": (i32, [p, i32, ctypes.POINTER(i32),
                             ctypes.POINTER(u64), ctypes.c_char_p,
                             ctypes.c_size_t, err]),
        "kvb_block_address": (i32, [p, i32, i64, i64, i64,
                                    ctypes.POINTER(u64), err]),
        "kvb_mapped_pages": (i64, [p]),
        "kvb_get_attach_stats": (i32, [p, ctypes.POINTER(_AttachStats),
                                       err]),
        "kvb_alloc": (i32, [p, i64, ctypes.c_char_p, pi64, i64, pi64, err]),
        "kvb_alloc_reserved": (i32, [p, i64, ctypes.c_char_p,
                                     ctypes.c_char_p, pi64, i64, pi64, err]),
        "kvb_reserve": (i32, [p, i64, i64, ctypes.c_char_p, ctypes.c_char_p,
                              ctypes.c_size_t, pi64, pi64, err]),
        "kvb_release_reservation": (i32, [p, ctypes.c_char_p, pi64, err]),
        "kvb_free": (i32, [p, pi64, i64, ctypes.c_char_p, pi64, err]),
        "kvb_capacity": (i32, [p, pi64, pi64, pi64, err]),
        "kvb_set_reply_spin": (i32, [p, i64, err]),
        "kvb_set_call_timeout": (i32, [p, i64, err]),
        "kvb_event_fd": (i32, [p]),
        "kvb_process_events": (i32, [p, err]),
        "kvb_set_revoke_callback": (None, [p, _REVOKE_CALLBACK, p]),
        "kvb_close": (i32, [p, i32, err]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def _check(code, err):
    if code != 0:
        raise EngineError(err.code, err.reason, err.protocol_error,
                          err.reason_name.decode(errors="replace"),
                          err.message.decode(errors="replace"))


def _bytes(s):
    return None if s is None else s.encode()


class KvView:
    """One layer's K or V over every block, for numpy.asarray (host) or
    torch.as_tensor (CUDA) without a copy."""

    def __init__(self, address, layout, dtype, block_shape, cuda):
        typestr = getattr(dtype, "str", None) or _TYPESTRS.get(str(dtype))
        if typestr is None:
            raise ValueError("unknown dtype %r" % (dtype,))
        itemsize = int(typestr[2:])
        if block_shape is None:
            block_shape = (layout.block_bytes // itemsize,)
        block_shape = tuple(int(d) for d in block_shape)
        elements = 1
        for d in block_shape:
            elements *= d
        if elements * itemsize != layout.block_bytes:
            raise ValueError(
                "block_shape %r of %s holds %d bytes; a block has %d" %
                (block_shape, typestr, elements * itemsize,
                 layout.block_bytes))
        inner = []
        stride = itemsize
        for d in reversed(block_shape):
            inner.insert(0, stride)
            stride *= d
        self.address = address
        self.shape = (layout.max_blocks,) + block_shape
        self.strides = (layout.block_stride_bytes,) + tuple(inner)
        self.typestr = typestr
        interface = {
            "shape": self.shape,
            "typestr": typestr,
            "data": (address, False),
            "strides": self.strides,
            "version": 3,
        }
        if cuda:
            self.__cuda_array_interface__ = interface
        else:
            self.__array_interface__ = interface


_WORD_BYTES = 8


def _word_rows(shape, strides, itemsize, address):
    """(rows, words per row, row stride in words) of a tensor of `shape`
    and element `strides` whose first dimension steps over rows that are
    each contiguous, a whole number of 8-byte words, 8-byte aligned and
    apart from one another; None for any other tensor."""
    if len(shape) < 2 or address % _WORD_BYTES or shape[0] < 1:
        return None
    row_elements = 1
    for size, stride in zip(reversed(shape[1:]), reversed(strides[1:])):
        if size != 1 and stride != row_elements:
            return None
        row_elements *= size
    row_bytes = row_elements * itemsize
    row_stride = strides[0] * itemsize
    if (row_bytes == 0 or row_bytes % _WORD_BYTES or
            row_stride % _WORD_BYTES or
            (shape[0] > 1 and row_stride < row_bytes)):
        return None
    return shape[0], row_bytes // _WORD_BYTES, row_stride // _WORD_BYTES


def _rows_overlap(a, a_address, b, b_address):
    """Whether two tensors of _word_rows `a` and `b` at those addresses
    span any byte in common (first byte to last, gaps included)."""
    def end(rows, address):
        n, words, stride = rows
        return address + ((n - 1) * stride + words) * _WORD_BYTES
    return (a_address < end(b, b_address) and
            b_address < end(a, a_address))


# torch.compile of _copy_words, made at the first copy_into that needs it;
# False once torch.compile failed in this process.
_compiled_copy = None
_compiled_copy_lock = threading.Lock()
# How many copy_into calls the compiled copy served (tests read it).
_compiled_copies = 0


def _copy_words(dst, src):
    dst.copy_(src)


def _as_word_rows(torch, t, rows):
    n, words, _ = rows
    try:
        return t.as_strided((n, words * _WORD_BYTES // t.element_size()),
                            (t.stride(0), 1)).view(torch.int64)
    except RuntimeError:  # a storage offset torch will not reinterpret
        return None


def copy_into(dst, src):
    """dst.copy_(src) for CUDA tensors, at the bandwidth of a contiguous
    copy where dst is a layer view (or any stack of contiguous rows); returns
    dst.

    PyTorch copies into a strided destination element by element: about
    half a contiguous copy's bandwidth for float16 rows, 0.84 x even as
    int64. A copy torch.compile generates for rows of 8-byte words with
    dynamic shapes reaches 0.98-1.02 x for blocks of 16 KiB to 2 MiB on an
    H100 (bench/RESULTS.md, "A torch copy at full bandwidth"). So where dst
    and src have the same dtype and shape on one CUDA device, each is such
    a stack of rows (src usually contiguous) and their spans of memory do
    not meet, they are copied as words by that one compiled copy: compiled
    on the first call in a process (tens of seconds), reused for every
    shape after. Anything else (a copy autograd records among them) is
    dst.copy_(src), as is every copy in a process where torch.compile
    failed (warned once).
    """
    global _compiled_copy, _compiled_copies
    import torch
    if (dst.device.type != "cuda" or src.device != dst.device or
            src.dtype != dst.dtype or src.shape != dst.shape or
            (dst.is_contiguous() and src.is_contiguous()) or
            (torch.is_grad_enabled() and
             (src.requires_grad or dst.requires_grad)) or
            _compiled_copy is False):
        return dst.copy_(src)
    dst_rows = _word_rows(tuple(dst.shape), tuple(dst.stride()),
                          dst.element_size(), dst.data_ptr())
    src_rows = _word_rows(tuple(src.shape), tuple(src.stride()),
                          src.element_size(), src.data_ptr())
    # Overlapping tensors are PyTorch's to refuse or to copy through a
    # temporary (two tensors over one mapping need not share a storage).
    if (dst_rows is None or src_rows is None or
            _rows_overlap(dst_rows, dst.data_ptr(), src_rows,
                          src.data_ptr())):
        return dst.copy_(src)
    d = _as_word_rows(torch, dst, dst_rows)
    s = _as_word_rows(torch, src, src_rows)
    if d is None or s is None:
        return dst.copy_(src)
    with _compiled_copy_lock:
        if _compiled_copy is None:
            _compiled_copy = torch.compile(_copy_words, dynamic=True)
        copy = _compiled_copy
    if copy is False:
        return dst.copy_(src)
    try:
        copy(d, s)
    except Exception as e:  # no Triton, no compiler, ...: PyTorch's copy
        warnings.warn("kvbroker.engine.copy_into: torch.compile failed (%s); "
                      "copying with dst.copy_(src) from now on" % (e,))
        _compiled_copy = False
        return dst.copy_(src)
    _compiled_copies += 1
    return dst


class Session:
    """A session on kvbrokerd's attach socket (see the module comment)."""

    def __init__(self, socket_path, holder, token="", reattach_grace=0.0,
                 library=None, reply_spin=0.0, call_timeout=30.0):
        self._lib = load_library(library)
        # Held around every C call on the handle, so that close(), which
        # frees the handle, never runs while another thread's call uses it
        # (the C ABI leaves that ordering to its caller). The C calls are
        # serialised inside the library anyway; this adds one uncontended
        # acquire and release per call.
        self._lock = threading.Lock()
        self._handle = ctypes.c_void_p()
        self._callback = None
        self._fd = -1
        self.layout = None
        err = _Error()
        _check(self._lib.kvb_connect(
            _bytes(socket_path), _bytes(token), _bytes(holder),
            int(reattach_grace * 1000), ctypes.byref(self._handle),
            ctypes.byref(err)), err)
        # Constant for the session's life: fileno() needs neither the lock
        # nor the library, so an event loop never waits for a call.
        self._fd = self._lib.kvb_event_fd(self._handle)
        if reply_spin:
            self.set_reply_spin(reply_spin)
        self.set_call_timeout(call_timeout)

    def set_reply_spin(self, seconds):
        """How long each call polls for the daemon's reply before it sleeps
        (0: not at all); a few tens of microseconds spare the thread a sleep
        and a wake per call, at the price of its CPU while it waits."""
        err = _Error()
        with self._lock:
            _check(self._lib.kvb_set_reply_spin(
                self._handle, int(seconds * 1e9), ctypes.byref(err)), err)

    def set_call_timeout(self, seconds):
        """How long each call waits for the daemon's reply before it raises
        EngineError DEADLINE_EXCEEDED (code 4); None waits forever, and
        0 or less is refused (INVALID_ARGUMENT). The
        call's outcome is then unknown (retry with the same request_id to
        learn it) and its late reply is dropped; an attach that runs out of
        time closes the session. The same bound applies to sending, which
        waits only while the daemon reads nothing; a send that runs out of
        time closes the session too."""
        if seconds is None:
            ns = 0  # the C ABI's "forever"
        else:
            ns = max(int(seconds * 1e9), 1) if seconds > 0 else -1
        err = _Error()
        with self._lock:
            _check(self._lib.kvb_set_call_timeout(self._handle, ns,
                                                  ctypes.byref(err)), err)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None) and hasattr(self, "_lock"):
            self.close(release=False)

    def attach(self, pool, devices=None, reservation_id="",
               reservation_blocks=0):
        """Attaches and maps the pool's pages; returns how many blocks the
        holder owns afterwards (a reattach or a redeemed reservation). A
        refusal by the daemon leaves the session usable; any other failure
        (a page or backend that cannot be mapped here, a malformed reply,
        no reply in time) closes it, since the daemon may have attached it
        already."""
        devs = list(devices or [])
        arr = (ctypes.c_int32 * len(devs))(*devs) if devs else None
        held = ctypes.c_int64()
        err = _Error()
        with self._lock:
            _check(self._lib.kvb_attach(
                self._handle, _bytes(pool), arr, len(devs),
                _bytes(reservation_id), reservation_blocks, ctypes.byref(held),
                ctypes.byref(err)), err)
            raw = _Layout()
            _check(self._lib.kvb_get_layout(self._handle, ctypes.byref(raw),
                                            ctypes.byref(err)), err)
        self.layout = Layout(raw)
        return held.value

    def device(self, index=0):
        """(ordinal, base address, uuid) of session device `index`."""
        ordinal = ctypes.c_int32()
        base = ctypes.c_uint64()
        uuid = ctypes.create_string_buffer(128)
        err = _Error()
        with self._lock:
            _check(self._lib.kvb_device(self._handle, index,
                                        ctypes.byref(ordinal),
                                        ctypes.byref(base), uuid, len(uuid),
                                        ctypes.byref(err)), err)
        return ordinal.value, base.value, uuid.value.decode()

    def block_address(self, block, layer=0, buffer=0, device=0):
        out = ctypes.c_uint64()
        err = _Error()
        with self._lock:
            _check(self._lib.kvb_block_address(self._handle, device, block,
                                               layer, buffer, ctypes.byref(out),
                                               ctypes.byref(err)), err)
        return out.value

    def kv_view(self, layer, buffer=0, device=0, dtype="uint8",
                block_shape=None):
        """The strided view of `layer`'s buffer (0: K, 1: V) over every
        block; see KvView."""
        return KvView(self.block_address(0, layer, buffer, device),
                      self.layout, dtype, block_shape, self.layout.is_cuda)

    @property
    def mapped_pages(self):
        with self._lock:
            return self._lib.kvb_mapped_pages(self._handle)

    def attach_stats(self):
        """Where the last attach's time went: a dict of kvb_attach_stats's
        fields (counts, and durations in nanoseconds)."""
        raw = _AttachStats()
        err = _Error()
        with self._lock:
            _check(self._lib.kvb_get_attach_stats(self._handle,
                                                  ctypes.byref(raw),
                                                  ctypes.byref(err)), err)
        return {name: getattr(raw, name) for name, _ in raw._fields_}

    def alloc(self, num_blocks, request_id="", reservation_id=""):
        """Allocates num_blocks blocks to this holder, all or nothing, and
        returns their ids. With reservation_id the reservation's blocks are
        taken first; what the call did not need stays reserved."""
        ids = (ctypes.c_int64 * max(num_blocks, 1))()
        n = ctypes.c_int64()
        err = _Error()
        with self._lock:
            if reservation_id:
                code = self._lib.kvb_alloc_reserved(
                    self._handle, num_blocks, _bytes(reservation_id),
                    _bytes(request_id), ids, max(num_blocks, 0),
                    ctypes.byref(n), ctypes.byref(err))
            else:
                code = self._lib.kvb_alloc(
                    self._handle, num_blocks, _bytes(request_id), ids,
                    max(num_blocks, 0), ctypes.byref(n), ctypes.byref(err))
        _check(code, err)
        return list(ids[:n.value])

    def reserve(self, num_blocks, ttl=0.0, request_id=""):
        """Sets num_blocks mapped blocks aside for ttl seconds (0: the
        daemon's default, 30 s), all or nothing; returns a Reservation.
        alloc(n, reservation_id=r.id) takes them; release_reservation(r.id)
        returns them."""
        rid = ctypes.create_string_buffer(_MAX_ID_LENGTH + 1)
        n = ctypes.c_int64()
        expire = ctypes.c_int64()
        err = _Error()
        with self._lock:
            _check(self._lib.kvb_reserve(
                self._handle, num_blocks, int(round(ttl * 1000)),
                _bytes(request_id), rid, len(rid), ctypes.byref(n),
                ctypes.byref(expire), ctypes.byref(err)), err)
        return Reservation(rid.value.decode(), n.value, expire.value / 1e9)

    def release_reservation(self, reservation_id):
        """Ends a reservation, returning the blocks still in it to the pool;
        returns how many (0 for a used-up one)."""
        released = ctypes.c_int64()
        err = _Error()
        with self._lock:
            _check(self._lib.kvb_release_reservation(
                self._handle, _bytes(reservation_id), ctypes.byref(released),
                ctypes.byref(err)), err)
        return released.value

    def free(self, block_ids, request_id=""):
        ids = list(block_ids)
        arr = (ctypes.c_int64 * max(len(ids), 1))(*ids)
        freed = ctypes.c_int64()
        err = _Error()
        with self._lock:
            _check(self._lib.kvb_free(self._handle, arr, len(ids),
                                      _bytes(request_id), ctypes.byref(freed),
                                      ctypes.byref(err)), err)
        return freed.value

    def capacity(self):
        """{"available_blocks", "allocated_blocks", "reserved_blocks"}."""
        vals = [ctypes.c_int64() for _ in range(3)]
        err = _Error()
        with self._lock:
            _check(self._lib.kvb_capacity(self._handle,
                                          *[ctypes.byref(v) for v in vals],
                                          ctypes.byref(err)), err)
        return dict(zip(("available_blocks", "allocated_blocks",
                         "reserved_blocks"), (v.value for v in vals)))

    def fileno(self):
        """Readable when the daemon sent something: call process_events.
        -1 once the session is closed."""
        return self._fd if self._handle else -1

    def process_events(self):
        """Maps new pages and carries out revocations sent by the daemon.
        Raises EngineError once the daemon ended the session: reason_name
        POOL_NOT_FOUND when the pool was deleted (its pages were revoked
        first), code CANCELLED for other ends."""
        err = _Error()
        with self._lock:
            _check(self._lib.kvb_process_events(self._handle,
                                                ctypes.byref(err)), err)

    def on_revoke(self, callback):
        """callback(list_of_page_ids), after those pages were unmapped."""
        if callback is None:
            new = None
        else:
            new = _REVOKE_CALLBACK(
                lambda _user, pages, n: callback([pages[i]
                                                  for i in range(n)]))
        # Until kvb_set_revoke_callback returns (it waits for the session's
        # lock), a process_events in another thread may be running the old
        # callback: its C trampoline lives as long as self._callback holds
        # it, so that is replaced only afterwards.
        with self._lock:
            self._lib.kvb_set_revoke_callback(
                self._handle, new if new is not None else _REVOKE_CALLBACK(),
                None)
            self._callback = new

    def close(self, release=True):
        """Ends the session; with release the holder's blocks go now.
        Returns once the daemon confirmed the end (at most 5 s), or at once
        when the daemon is gone: the holder may then reconnect at once.
        Raises EngineError DEADLINE_EXCEEDED (code 4) when no confirmation
        came; the session is closed anyway. A call in flight in another
        thread finishes first; later calls raise EngineError
        INVALID_ARGUMENT ("session is NULL"). Must not be called from the
        revocation callback."""
        with self._lock:
            if not self._handle:
                return
            handle, self._handle = self._handle, ctypes.c_void_p()
            err = _Error()
            code = self._lib.kvb_close(handle, 1 if release else 0,
                                       ctypes.byref(err))
        _check(code, err)
