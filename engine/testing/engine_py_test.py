"""kvbroker.engine (Python, ctypes over libkvbroker_engine.so) against a real
kvbrokerd process on the host backend, in a process that has imported numpy
first."""

import ctypes
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy
import pytest

from kvbroker import engine

# Programs this test starts carry their own sanitizer runtime, if any.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}

TOKEN = "engine-token-0123456789"
OTHER_TOKEN = "other-pool-token-0123456789"
POOLS = """
pools { name: "kv" page_size: 2097152 block_bytes: 262144 num_layers: 2
        num_kv_buffers: 2 max_blocks: 64 tokens_per_block: 16 }
pools { name: "other" page_size: 2097152 block_bytes: 262144 max_blocks: 8 }
"""
TOKENS = """
tokens { name: "engine" token: "%s" pools: "kv" }
tokens { name: "other" token: "%s" pools: "other" }
""" % (TOKEN, OTHER_TOKEN)


# The daemon process behind each attach socket the fixture yields.
PROCS = {}


@pytest.fixture
def daemon():
    # Socket paths must fit sun_path: a short directory under /tmp.
    d = tempfile.mkdtemp(prefix="kvb-py-", dir="/tmp")
    with open(os.path.join(d, "pools.textproto"), "w") as f:
        f.write(POOLS)
    with open(os.path.join(d, "tokens.textproto"), "w") as f:
        f.write(TOKENS)
    sock = os.path.join(d, "attach.sock")
    proc = subprocess.Popen(
        [os.environ["KVBROKERD"], "--backend=host", "--listen=127.0.0.1:0",
         "--unix_socket=" + os.path.join(d, "grpc.sock"),
         "--attach_socket=" + sock,
         "--pools=" + os.path.join(d, "pools.textproto"),
         "--auth_tokens=" + os.path.join(d, "tokens.textproto"),
         "--min_idle_pages=0", "--host_device_memory=1GiB"],
        stdout=subprocess.PIPE, text=True, env=CHILD_ENV)
    try:
        while True:
            line = proc.stdout.readline()
            assert line, "kvbrokerd exited before serving"
            if line.startswith("kvbrokerd:"):
                assert "engines attach on " + sock in line, line
                break
        PROCS[sock] = proc
        yield sock
    finally:
        PROCS.pop(sock, None)
        proc.kill()
        proc.wait()
        shutil.rmtree(d)


def test_library_exports_only_the_c_abi():
    lib = engine.load_library()
    assert lib.kvb_abi_version() == 4
    with pytest.raises(AttributeError):
        lib.KvBrokerInternalSymbolThatDoesNotExist
    # C++ symbols of the implementation stay hidden.
    with pytest.raises(AttributeError):
        getattr(lib, "_ZN8kvbroker6engine7Session7ConnectERKNS0_14ConnectOptionsE")


def test_attach_layout_and_views(daemon):
    with engine.Session(daemon, holder="py-rank0", token=TOKEN) as s:
        assert s.attach("kv") == 0
        lay = s.layout
        assert (lay.bundle_bytes, lay.block_stride_bytes,
                lay.layer_offset_bytes, lay.buffer_offset_bytes) == (
                    8 << 20, 1 << 20, 512 << 10, 256 << 10)
        assert (lay.page_count, lay.max_blocks, lay.num_layers,
                lay.num_kv_buffers) == (8, 64, 2, 2)
        assert lay.virtual_bytes_per_device == 64 << 20
        assert lay.is_cuda is False
        ordinal, base, uuid = s.device(0)
        assert (ordinal, uuid) == (0, "host-0")
        assert base != 0
        assert s.block_address(5, layer=1, buffer=1) == (
            base + 5 * (1 << 20) + (512 << 10) + (256 << 10))

        # V of layer 1 as float16 blocks of 16 tokens x 8 heads x 1024.
        view = s.kv_view(layer=1, buffer=1, dtype="float16",
                         block_shape=(16, 8, 1024))
        assert not hasattr(view, "__cuda_array_interface__")
        arr = numpy.asarray(view)
        assert arr.dtype == numpy.float16
        assert arr.shape == (64, 16, 8, 1024)
        assert arr.strides == (1 << 20, 8 * 1024 * 2, 1024 * 2, 2)
        assert arr.ctypes.data == s.block_address(0, layer=1, buffer=1)
        assert arr[7].ctypes.data == s.block_address(7, layer=1, buffer=1)
        with pytest.raises(ValueError):
            s.kv_view(layer=0, dtype="float32", block_shape=(3,))
        with pytest.raises(engine.EngineError) as e:
            s.block_address(64)
        assert e.value.reason_name == "INVALID_ARGUMENT"


def test_copy_into_sees_a_layer_view_as_rows_of_words(daemon):
    """copy_into's choice (its torch part runs on CUDA, tools/gpu-run): a
    layer view, or a slice of one, is rows of 8-byte words; a tensor it
    could not copy word by word faithfully is left to PyTorch's copy."""
    rows = engine._word_rows
    with engine.Session(daemon, holder="py-words", token=TOKEN) as s:
        s.attach("kv")
        for dtype, shape in (("uint8", None), ("float16", (16, 8, 1024))):
            arr = numpy.asarray(s.kv_view(layer=1, buffer=0, dtype=dtype,
                                          block_shape=shape))
            strides = tuple(x // arr.itemsize for x in arr.strides)
            # 64 blocks of 256 KiB, 1 MiB apart: 32 Ki words a row.
            assert rows(arr.shape, strides, arr.itemsize,
                        arr.ctypes.data) == (64, 32 << 10, 128 << 10)
            part = arr[3:9]
            assert rows(part.shape, strides, arr.itemsize,
                        part.ctypes.data) == (6, 32 << 10, 128 << 10)
    # A contiguous source of the same shape: rows one after another.
    assert rows((6, 16, 8, 1024), (131072, 8192, 1024, 1), 2, 4096) == (
        6, 32 << 10, 32 << 10)
    # Dimensions of one element may have any stride.
    assert rows((4, 1, 64), (64, 999, 1), 2, 0) == (4, 16, 16)
    # One row: its stride is never taken.
    assert rows((1, 64), (0, 1), 2, 8) == (1, 16, 0)
    # Not rows of whole aligned words: PyTorch's copy.
    assert rows((64,), (1,), 8, 0) is None  # one dimension
    assert rows((4, 12), (12, 1), 1, 0) is None  # 12-byte rows
    assert rows((4, 64), (65, 1), 2, 0) is None  # rows 130 bytes apart
    assert rows((4, 64), (64, 1), 2, 4) is None  # misaligned start
    assert rows((4, 8, 8), (64, 1, 8), 2, 0) is None  # a transposed block
    assert rows((4, 64), (0, 1), 2, 0) is None  # one row seen 4 times
    assert rows((4, 64), (32, 1), 2, 0) is None  # overlapping rows
    assert rows((4, 64), (-64, 1), 2, 4096) is None  # rows backwards
    assert rows((0, 64), (64, 1), 2, 0) is None  # nothing to copy


def test_copy_into_leaves_overlapping_tensors_to_pytorch():
    """Two tensors whose spans meet (first byte to last: a layer view and
    another layer's view over the same blocks interleave) are not copied
    by the compiled copy, which assumes they do not alias."""
    overlap = engine._rows_overlap
    layer0 = (64, 32 << 10, 128 << 10)  # rows of 256 KiB, 1 MiB apart
    base = 1 << 30
    # Layer 1 of the same blocks: inside layer 0's span.
    assert overlap(layer0, base, layer0, base + (512 << 10))
    assert overlap(layer0, base + (512 << 10), layer0, base)
    # A source just past the span's last byte, or just before its first.
    end = base + 63 * (1 << 20) + (256 << 10)
    contiguous = (64, 32 << 10, 32 << 10)
    assert not overlap(layer0, base, contiguous, end)
    assert overlap(layer0, base, contiguous, end - 8)
    assert not overlap(layer0, base, contiguous, base - (16 << 20))
    assert overlap(layer0, base, contiguous, base - (16 << 20) + 8)
    # One row.
    assert not overlap((1, 4, 0), 0, (1, 4, 0), 32)
    assert overlap((1, 4, 0), 0, (1, 4, 0), 24)


class _StandInTorch:
    """Just enough of torch's surface for copy_into's choices, on machines
    without PyTorch (copy_into_test.py runs the real one on a GPU): tensors
    record which copy wrote them."""

    int64 = "int64"

    def __init__(self, compile_fails=False):
        self.grad = False
        self.compile_fails = compile_fails
        self.compiled = []

    def is_grad_enabled(self):
        return self.grad

    def compile(self, fn, dynamic):
        assert dynamic is True
        self.compiled.append(fn)

        def run(dst, src):
            if self.compile_fails:
                raise RuntimeError("no Triton here")
            dst.base.written_by = "compiled"
        return run


class _StandInDevice:
    def __init__(self, kind):
        self.type = kind


class _StandInTensor:
    CUDA, CPU = _StandInDevice("cuda"), _StandInDevice("cpu")

    def __init__(self, shape, strides, address, itemsize=2, cuda=True):
        self.shape, self._strides, self._address = shape, strides, address
        self._itemsize = itemsize
        self.device = self.CUDA if cuda else self.CPU
        self.dtype = "float16"
        self.requires_grad = False
        self.written_by = None
        self.base = self

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]

    def element_size(self):
        return self._itemsize

    def data_ptr(self):
        return self._address

    def is_contiguous(self):  # the stand-ins are all two-dimensional
        return self._strides == (self.shape[1], 1)

    def as_strided(self, shape, strides):
        view = _StandInTensor(shape, strides, self._address, self._itemsize)
        view.base = self.base
        return view

    def view(self, dtype):
        return self

    def copy_(self, src):
        self.base.written_by = "pytorch"
        return self


def test_copy_into_chooses_its_copy(monkeypatch):
    """Which copies copy_into gives the compiled copy, with a stand-in for
    torch: a layer view (rows 1 MiB apart) from a separate source does,
    what PyTorch must judge does not, and once torch.compile fails every
    copy is PyTorch's (warned once)."""
    torch = _StandInTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(engine, "_compiled_copy", None)
    monkeypatch.setattr(engine, "_compiled_copies", 0)

    def layer(address=1 << 30):
        return _StandInTensor((64, 128 << 10), (512 << 10, 1), address)

    def source(address=8 << 30, shape=(64, 128 << 10)):
        return _StandInTensor(shape, (shape[1], 1), address)

    def copied_by(dst, src):
        assert engine.copy_into(dst, src) is dst
        return dst.base.written_by

    assert copied_by(layer(), source()) == "compiled"
    assert len(torch.compiled) == 1 and engine._compiled_copies == 1
    assert copied_by(layer(), source()) == "compiled"
    assert len(torch.compiled) == 1  # compiled once
    # PyTorch's: another layer of the same blocks (spans meet), shapes or
    # dtypes that differ, contiguous pairs, CPU tensors, autograd.
    assert copied_by(layer(), layer((1 << 30) + (256 << 10))) == "pytorch"
    assert copied_by(layer(), source(shape=(32, 128 << 10))) == "pytorch"
    other = source()
    other.dtype = "bfloat16"
    assert copied_by(layer(), other) == "pytorch"
    assert copied_by(source(), source(16 << 30)) == "pytorch"
    cpu = _StandInTensor((64, 128 << 10), (512 << 10, 1), 1 << 30,
                         cuda=False)
    assert copied_by(cpu, source()) == "pytorch"
    torch.grad = True
    grad = source()
    grad.requires_grad = True
    assert copied_by(layer(), grad) == "pytorch"
    assert copied_by(layer(), source()) == "compiled"
    torch.grad = False
    assert engine._compiled_copies == 3

    # torch.compile fails: PyTorch's copy, now and from then on.
    torch.compile_fails = True
    with pytest.warns(UserWarning, match="torch.compile failed"):
        assert copied_by(layer(), source()) == "pytorch"
    assert engine._compiled_copy is False
    assert copied_by(layer(), source()) == "pytorch"
    assert engine._compiled_copies == 3


def test_alloc_free_capacity_are_exact_and_typed(daemon):
    with engine.Session(daemon, holder="py-a", token=TOKEN) as a, \
            engine.Session(daemon, holder="py-b", token=TOKEN) as b:
        a.attach("kv")
        b.attach("kv")
        assert a.capacity()["available_blocks"] == 64
        mine = a.alloc(60)
        assert len(mine) == 60 and len(set(mine)) == 60
        with pytest.raises(engine.EngineError) as e:
            b.alloc(5)
        assert e.value.reason_name == "POOL_EXHAUSTED"
        assert e.value.code == 8  # RESOURCE_EXHAUSTED
        theirs = b.alloc(4)
        assert b.capacity() == {"available_blocks": 0,
                                "allocated_blocks": 64,
                                "reserved_blocks": 0}
        with pytest.raises(engine.EngineError) as e:
            b.free([theirs[0], mine[0]])
        assert e.value.reason_name == "BLOCK_NOT_ALLOCATED"
        assert a.capacity()["allocated_blocks"] == 64
        assert a.free(mine) == 60
        assert b.free(theirs) == 4
        assert a.capacity()["available_blocks"] == 64
        assert a.alloc(3, request_id="r1") == a.alloc(3, request_id="r1")
        assert a.capacity()["allocated_blocks"] == 3


def test_reservations_on_the_session_admit_exactly(daemon):
    """Reserve, then Alloc from the reservation or release it, on the
    engine's own session: the numbers Capacity shows at every step, and
    each refusal typed and changing nothing."""
    def cap(s):
        c = s.capacity()
        return (c["available_blocks"], c["allocated_blocks"],
                c["reserved_blocks"])

    with engine.Session(daemon, holder="py-res", token=TOKEN) as s, \
            engine.Session(daemon, holder="py-crowd", token=TOKEN) as o:
        s.attach("kv")
        o.attach("kv")
        before = time.time()
        r = s.reserve(10, ttl=60)
        after = time.time()
        assert r.num_blocks == 10 and r.id
        assert before + 60 - 1 <= r.expire_time <= after + 60 + 1
        assert cap(s) == (54, 0, 10)
        theirs = o.alloc(50)
        assert cap(s) == (4, 50, 10)

        # The reservation and the 4 available cover 14 blocks, not 15.
        with pytest.raises(engine.EngineError) as e:
            s.alloc(15, reservation_id=r.id)
        assert e.value.reason_name == "RESERVATION_TOO_SMALL"
        assert e.value.code == 9  # FAILED_PRECONDITION
        assert cap(s) == (4, 50, 10)
        # 6 of the reservation's 10, then its other 4 and 2 available.
        mine = s.alloc(6, reservation_id=r.id)
        assert cap(s) == (4, 56, 4)
        mine += s.alloc(6, reservation_id=r.id)
        assert len(set(mine)) == 12 and not set(mine) & set(theirs)
        assert cap(s) == (2, 62, 0)
        # Used up, the reservation lives on empty until released.
        assert s.release_reservation(r.id) == 0
        for call in (lambda: s.release_reservation(r.id),
                     lambda: s.alloc(1, reservation_id=r.id)):
            with pytest.raises(engine.EngineError) as e:
                call()
            assert e.value.reason_name == "RESERVATION_NOT_FOUND"
        # The blocks are this holder's.
        with pytest.raises(engine.EngineError) as e:
            o.free(mine[:1])
        assert e.value.reason_name == "BLOCK_NOT_ALLOCATED"
        assert cap(s) == (2, 62, 0)

        # A retry with the same request id answers the same reservation.
        r2 = s.reserve(2, request_id="admit-7")
        assert s.reserve(2, request_id="admit-7").id == r2.id
        assert cap(s) == (0, 62, 2)
        with pytest.raises(engine.EngineError) as e:
            s.reserve(1)
        assert e.value.reason_name == "POOL_EXHAUSTED"
        assert s.release_reservation(r2.id) == 2
        assert cap(s) == (2, 62, 0)

        # Bad input: typed, nothing reserved.
        for kwargs in ({"num_blocks": 0}, {"num_blocks": -3},
                       {"num_blocks": 1, "ttl": -1.0}):
            with pytest.raises(engine.EngineError) as e:
                s.reserve(**kwargs)
            assert e.value.code == 3, kwargs  # INVALID_ARGUMENT
        with pytest.raises(engine.EngineError) as e:
            s.release_reservation("res-999999")
        assert e.value.reason_name == "RESERVATION_NOT_FOUND"
        with pytest.raises(engine.EngineError) as e:
            s.alloc(1, reservation_id="x" * 129)
        assert e.value.code == 3
        assert cap(s) == (2, 62, 0)

        # The C ABI refuses a reservation id buffer without room for the
        # longest id before it sends anything.
        lib = engine.load_library()
        err = engine._Error()
        small = ctypes.create_string_buffer(64)
        assert lib.kvb_reserve(s._handle, 1, 0, None, small, len(small),
                               None, None, ctypes.byref(err)) == 3
        assert err.reason_name == b"INVALID_ARGUMENT"
        assert b"KVB_MAX_ID_LENGTH" in err.message
        # An empty reservation id, with room for the block: refused, not
        # taken as a plain kvb_alloc.
        room = (ctypes.c_int64 * 1)()
        assert lib.kvb_alloc_reserved(s._handle, 1, b"", None, room, 1, None,
                                      ctypes.byref(err)) == 3
        assert b"reservation_id" in err.message
        assert cap(s) == (2, 62, 0)
        assert s.free(mine) == 12
        assert o.free(theirs) == 50
        assert cap(s) == (64, 0, 0)


def test_reply_spin_serves_the_same_calls(daemon):
    with engine.Session(daemon, holder="py-spin", token=TOKEN,
                        reply_spin=50e-6) as s:
        s.attach("kv")
        ids = s.alloc(5)
        assert len(set(ids)) == 5
        assert s.capacity()["allocated_blocks"] == 5
        s.set_reply_spin(0)
        assert s.free(ids) == 5
        with pytest.raises(engine.EngineError) as e:
            s.set_reply_spin(-1e-6)
        assert e.value.reason_name == "INVALID_ARGUMENT"
        assert e.value.code == 3
        assert s.capacity()["allocated_blocks"] == 0


def wait_stopped(pid):
    """Returns once every thread of `pid` is stopped: kill() returns before
    a running thread has taken the SIGSTOP."""
    for _ in range(500):
        states = []
        for task in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/stat" % (pid, task)) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                pass  # a thread that exited
        if states and all(st in ("T", "t") for st in states):
            return
        time.sleep(0.01)
    raise AssertionError("kvbrokerd %d did not stop: %s" % (pid, states))


def test_a_wedged_daemon_times_calls_out_and_a_retry_learns_the_outcome(
        daemon):
    with engine.Session(daemon, holder="py-timeout", token=TOKEN,
                        call_timeout=10.0) as s:
        s.attach("kv")
        assert len(s.alloc(2, request_id="t-1")) == 2
        s.set_call_timeout(0.2)
        proc = PROCS[daemon]
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            wait_stopped(proc.pid)
            with pytest.raises(engine.EngineError) as e:
                s.alloc(3, request_id="t-2")
            assert e.value.code == 4  # DEADLINE_EXCEEDED
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        s.set_call_timeout(10.0)
        # The daemon ran the Alloc once it woke; its late reply is dropped
        # and the retry answers with the same blocks.
        more = s.alloc(3, request_id="t-2")
        assert len(more) == 3
        assert s.capacity()["allocated_blocks"] == 5
        for bad in (0, -1.0):
            with pytest.raises(engine.EngineError) as e:
                s.set_call_timeout(bad)
            assert e.value.reason_name == "INVALID_ARGUMENT"
        s.set_call_timeout(None)
        assert s.capacity()["allocated_blocks"] == 5


def test_a_with_block_ends_quietly_after_the_daemon_died(daemon):
    # Killed, the daemon sends no SessionEnd: the first call finds it gone,
    # the session is closed from then on, and leaving the block raises
    # nothing (the pages stay mapped until close unmaps them).
    with engine.Session(daemon, holder="py-crash", token=TOKEN) as s:
        s.attach("kv")
        s.alloc(2)
        proc = PROCS[daemon]
        proc.kill()
        proc.wait()
        with pytest.raises(engine.EngineError) as e:
            s.capacity()
        assert e.value.code in (1, 14), e.value  # CANCELLED, UNAVAILABLE
        with pytest.raises(engine.EngineError) as e:
            s.capacity()
        assert e.value.code == 9, e.value  # FAILED_PRECONDITION
    assert s.mapped_pages == 0


def test_session_end_and_reattach(daemon):
    s = engine.Session(daemon, holder="py-grace", token=TOKEN,
                       reattach_grace=600)
    s.attach("kv")
    blocks = s.alloc(6)
    s.close(release=False)
    # close() returns once the daemon confirmed the end: the holder's blocks
    # are parked and the same holder may say hello again at once.
    again = engine.Session(daemon, holder="py-grace", token=TOKEN,
                           reattach_grace=600)
    assert again.attach("kv") == 6
    assert again.free(blocks) == 6
    again.close()
    for round in range(20):
        with engine.Session(daemon, holder="py-loop", token=TOKEN,
                            reattach_grace=600) as s:
            assert s.attach("kv") == (0 if round == 0 else 1)
            if round == 0:
                s.alloc(1)
            s.close(release=False)


def ctl(daemon, *args):
    """kvbrokerctl against the daemon's gRPC Unix socket, as the engine."""
    grpc = os.path.join(os.path.dirname(daemon), "grpc.sock")
    return subprocess.run(
        [os.environ["KVBROKERCTL"], "--server=unix:" + grpc,
         "--token=" + TOKEN] + list(args),
        capture_output=True, text=True, env=CHILD_ENV)


def test_attach_stats_say_where_the_attach_went(daemon):
    with engine.Session(daemon, holder="py-stats-a", token=TOKEN) as a:
        a.attach("kv")
        ids = a.alloc(12)  # pages 0 and 1
        with engine.Session(daemon, holder="py-stats-b", token=TOKEN) as b:
            assert set(b.attach_stats().values()) == {0}
            b.attach("kv")
            st = b.attach_stats()
            assert b.mapped_pages == 2
            # One frame; pages 0 and 1 are adjacent: one mprotect; the host
            # backend imports nothing.
            assert (st["pages"], st["frames"], st["set_access_calls"],
                    st["import_ns"]) == (2, 1, 1, 0)
            # Disjoint parts of the attach, each measured inside it.
            parts = (st["receive_ns"] + st["setup_ns"] + st["map_ns"] +
                     st["set_access_ns"])
            assert 0 < parts <= st["total_ns"]
        a.free(ids)


def test_deleted_pool_revokes_pages_and_ends_the_session(daemon):
    revoked = []
    with engine.Session(daemon, holder="py-deleted", token=TOKEN) as s:
        s.attach("kv")
        s.on_revoke(revoked.extend)
        s.alloc(12)
        assert s.mapped_pages == 2
        # Without --force: refused, the session untouched.
        out = ctl(daemon, "delete-pool", "kv")
        assert out.returncode != 0 and "POOL_NOT_EMPTY" in out.stderr, out
        assert s.capacity()["allocated_blocks"] == 12
        out = ctl(daemon, "delete-pool", "kv", "--force")
        assert out.returncode == 0, out.stderr
        # The revocation comes first (the pages are unmapped and
        # acknowledged), then the typed end of the session.
        with pytest.raises(engine.EngineError) as e:
            while True:
                select.select([s], [], [])
                s.process_events()
        assert e.value.reason_name == "POOL_NOT_FOUND"
        assert "POOL_DELETED" in e.value.message
        assert sorted(revoked) == [0, 1]
        assert s.mapped_pages == 0


def test_on_revoke_keeps_the_old_callback_while_it_may_run(daemon):
    # The old callback runs in another thread's process_events (the
    # revocation of a force-deleted pool) while this thread installs a new
    # one: the session must hold the old C callback object until the C side
    # has let go of it, which it cannot while the old callback runs.
    dropped = []
    started = threading.Event()
    with engine.Session(daemon, holder="py-swap", token=TOKEN) as s:
        s.attach("kv")
        s.alloc(12)  # pages 0 and 1

        def old_callback(pages):
            started.set()
            # The swap has up to 2 s to let go of this callback's C object.
            until = time.monotonic() + 2
            while time.monotonic() < until and not dropped:
                if sys.getrefcount(old_c) < held:
                    dropped.append(True)
                time.sleep(0.01)

        s.on_revoke(old_callback)
        old_c = s._callback  # kept, so that a wrong release cannot crash
        held = sys.getrefcount(old_c)
        ended = []

        def events():
            try:
                while True:
                    select.select([s], [], [])
                    s.process_events()
            except engine.EngineError as e:
                ended.append(e.reason_name)

        t = threading.Thread(target=events)
        t.start()
        out = ctl(daemon, "delete-pool", "kv", "--force")
        assert out.returncode == 0, out.stderr
        assert started.wait(30)
        s.on_revoke(lambda pages: None)
        t.join()
        assert ended == ["POOL_NOT_FOUND"]
        assert not dropped
        assert s._callback is not old_c


def test_close_waits_for_calls_in_other_threads(daemon):
    # Threads call into the session while another closes it: every call
    # either finishes before the close or is refused after it, none runs on
    # a freed session.
    s = engine.Session(daemon, holder="py-close-race", token=TOKEN)
    s.attach("kv")
    calls = [0] * 4
    refused = []
    go = threading.Event()

    def hammer(i):
        go.wait()
        while True:
            try:
                s.capacity()
                calls[i] += 1
            except engine.EngineError as e:
                refused.append((e.code, e.message))
                return

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    go.set()
    while sum(calls) < 200:
        time.sleep(0.001)
    s.close()
    for t in threads:
        t.join()
    assert refused == [(3, "session is NULL")] * 4  # INVALID_ARGUMENT
    assert s.fileno() == -1


def test_tokens_are_scoped(daemon):
    with pytest.raises(engine.EngineError) as e:
        engine.Session(daemon, holder="x", token="not-a-token-0123456789")
    assert e.value.reason_name == "UNAUTHENTICATED"
    with engine.Session(daemon, holder="x", token=OTHER_TOKEN) as s:
        with pytest.raises(engine.EngineError) as e:
            s.attach("kv")
        assert e.value.reason_name == "PERMISSION_DENIED"
        assert e.value.code == 7
        s.attach("other")
        assert len(s.alloc(8)) == 8


def test_event_fd_and_callbacks(daemon):
    with engine.Session(daemon, holder="py-events", token=TOKEN) as s:
        s.attach("kv")
        assert s.fileno() > 2
        seen = []
        s.on_revoke(seen.append)
        s.process_events()  # nothing pending: returns at once
        assert seen == []
        s.on_revoke(None)


# The reader: a second process attached to the same pool, which prints, per
# block, whether its K and V of every layer hold the writer's pattern.
READER = r"""
import sys
import numpy
from kvbroker import engine
sock, token, blocks = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3:]]
with engine.Session(sock, holder="py-reader", token=token) as s:
    s.attach("kv")
    s.capacity()  # a round trip: every page announced so far is mapped
    lay = s.layout
    bad = 0
    for layer in range(lay.num_layers):
        for buf in range(lay.num_kv_buffers):
            arr = numpy.asarray(s.kv_view(layer=layer, buffer=buf,
                                          dtype="uint32"))
            for b in blocks:
                want = numpy.arange(arr.shape[1], dtype=numpy.uint32) + (
                    b * 1000003 + layer * 7919 + buf * 104729)
                bad += int(numpy.count_nonzero(arr[b] != want))
    print("bad", bad, "pages", s.mapped_pages)
"""


def _pattern(arr, b, layer, buf):
    return numpy.arange(arr.shape[1], dtype=numpy.uint32) + (
        b * 1000003 + layer * 7919 + buf * 104729)


def test_numpy_writes_are_read_by_another_process(daemon):
    with engine.Session(daemon, holder="py-writer", token=TOKEN) as w:
        w.attach("kv")
        blocks = w.alloc(12)  # pages 0 and 1 (8 blocks per page)
        lay = w.layout
        for layer in range(lay.num_layers):
            for buf in range(lay.num_kv_buffers):
                arr = numpy.asarray(w.kv_view(layer=layer, buffer=buf,
                                              dtype="uint32"))
                for b in blocks:
                    arr[b] = _pattern(arr, b, layer, buf)
        reader = [os.environ.get("PYTHON", "/usr/bin/python3"), "-c", READER,
                  daemon, TOKEN] + [str(b) for b in blocks]
        out = subprocess.run(reader, capture_output=True, text=True,
                             check=True).stdout
        assert out == "bad 0 pages 2\n", out
        # Another pattern in one block: the reader sees the change.
        arr = numpy.asarray(w.kv_view(layer=1, buffer=1, dtype="uint32"))
        arr[blocks[3]] += 1
        out = subprocess.run(reader, capture_output=True, text=True,
                             check=True).stdout
        assert out == "bad %d pages 2\n" % arr.shape[1], out
        assert w.free(blocks) == 12


def test_unreachable_daemon_is_unavailable():
    with pytest.raises(engine.EngineError) as e:
        engine.Session("/tmp/kvb-no-such-socket.sock", holder="x")
    assert e.value.code == 14  # UNAVAILABLE
    assert "no such file" in e.value.message.lower()


def _readme():
    with open("README.md") as f:
        return f.read()


def test_readme_cpp_example_is_the_tested_one_and_runs(daemon):
    source = open("engine/testing/readme_example.cc").read()
    body = source.split("// README:begin\n")[1].split("  // README:end")[0]
    shown = "\n".join(line[2:] if line.startswith("  ") else line
                      for line in body.rstrip("\n").split("\n"))
    assert "```cpp\n" + shown + "\n```" in _readme()
    out = subprocess.run(["engine/readme_example", daemon, TOKEN],
                         capture_output=True, text=True, check=True,
                         env=CHILD_ENV).stdout
    assert out.startswith("4 blocks; V of layer 1 of block "), out


def test_readme_python_example_runs(daemon, capsys):
    readme = _readme()
    section = readme[readme.index("## Engines"):]
    code = section.split("```python\n")[1].split("```")[0]
    exec(compile(code, "README.md", "exec"),
         {"socket_path": daemon, "token": TOKEN})
    out = capsys.readouterr().out
    assert out == "4 (64, 131072) (1048576, 2)\n8 0\n", out
