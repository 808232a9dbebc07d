"""engine_bandwidth_bench: does memory an engine attached from kvbrokerd copy
as fast as memory PyTorch allocated itself? In one run, on one GPU:

  - a torch copy of a source tensor into one layer's K view over every block
    of an attached pool (torch.as_tensor over kvbroker.engine's
    __cuda_array_interface__: rows of block_bytes, block_stride_bytes apart),
    against the same copy into a torch.empty tensor of the same shape;
  - the same layer view as float16 (what KV caches hold), against a
    torch.empty of the same shape and against torch.empty_strided with the
    view's own strides (the same copy kernel on PyTorch's own memory, which
    tells the attached memory apart from the cost of a strided copy);
  - the same layer view as int64 (the widest element PyTorch's strided copy
    moves a thread at a time), and written by the driver's own 2-D copy
    (cuMemcpy2DAsync, rows of block_bytes at the view's pitch);
  - the layer view as uint8 and as float16 written by
    kvbroker.engine.copy_into (a torch.compile'd copy of rows of 8-byte
    words), against the same call into a torch.empty (a contiguous
    destination, which copy_into leaves to PyTorch's own copy);
  - the same for a contiguous range of whole blocks.

Rounds alternate the two destinations; the table reports the median GB/s
(bytes copied per second, cuda events) and the ratio. Target: a torch copy
into the layer view >= 0.95 x the same into torch.empty.

KVB_BENCH_BLOCK_BYTES sets the block (default 2 MiB: rows of 2 MiB, 128 MiB
apart); the pool is 32 GiB whatever it is (KVB_BENCH_BLOCKS overrides).

    KVBROKERD=... KVBROKER_ENGINE_LIBRARY=... PYTHONPATH=py \\
        python3 bench/engine_bandwidth_bench.py

Prints "SKIPPED: why" and exits 0 without torch or a CUDA device.
"""

import ctypes
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile

PAGE = 2 << 20
LAYERS = 32
BLOCK_BYTES = int(os.environ.get("KVB_BENCH_BLOCK_BYTES", str(2 << 20)))
BLOCKS = int(os.environ.get("KVB_BENCH_BLOCKS",
                            str((32 << 30) // (BLOCK_BYTES * LAYERS * 2))))
CONTIGUOUS_BYTES = 1 << 30
ROUNDS = 7
COPIES = 10
CU_MEMORYTYPE_DEVICE = 2


class _Memcpy2D(ctypes.Structure):
    """CUDA_MEMCPY2D of the driver API (cuda.h)."""
    _fields_ = [
        ("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t),
        ("srcMemoryType", ctypes.c_int), ("srcHost", ctypes.c_void_p),
        ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
        ("srcPitch", ctypes.c_size_t),
        ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t),
        ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p),
        ("dstDevice", ctypes.c_uint64), ("dstArray", ctypes.c_void_p),
        ("dstPitch", ctypes.c_size_t),
        ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t),
    ]


def driver_copy_2d(torch):
    """copy(dst, src): the driver's 2-D copy of contiguous `src` into the
    rows of `dst` (one row per block), on torch's current stream."""
    copy = ctypes.CDLL("libcuda.so.1").cuMemcpy2DAsync_v2
    copy.argtypes = [ctypes.POINTER(_Memcpy2D), ctypes.c_void_p]

    def run(dst, src):
        m = _Memcpy2D()
        m.srcMemoryType = m.dstMemoryType = CU_MEMORYTYPE_DEVICE
        m.srcDevice, m.dstDevice = src.data_ptr(), dst.data_ptr()
        m.WidthInBytes = m.srcPitch = src.stride(0) * src.element_size()
        m.dstPitch = dst.stride(0) * dst.element_size()
        m.Height = dst.shape[0]
        stream = torch.cuda.current_stream().cuda_stream
        rc = copy(ctypes.byref(m), ctypes.c_void_p(stream))
        if rc != 0:
            raise SystemExit("cuMemcpy2DAsync failed: CUresult %d" % rc)
    return run


class CopiedBy:
    """A destination tensor whose copy_(src) is copy(view, src)."""

    def __init__(self, view, copy):
        self.view, self._copy = view, copy
        self.shape, self.dtype = view.shape, view.dtype

    def numel(self):
        return self.view.numel()

    def element_size(self):
        return self.view.element_size()

    def copy_(self, src):
        self._copy(self.view, src)


def cuda_torch():
    """torch, or None after printing "SKIPPED: why" where there is no torch
    or no CUDA device."""
    try:
        import torch
    except ImportError:
        print("SKIPPED: no torch")
        return None
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return None
    return torch


def main():
    torch = cuda_torch()
    if torch is None:
        return 0
    from kvbroker import engine

    d = tempfile.mkdtemp(prefix="kvb-bw-", dir="/tmp")
    pools = os.path.join(d, "pools.textproto")
    with open(pools, "w") as f:
        f.write('pools { name: "bw" page_size: %d block_bytes: %d '
                'num_layers: %d num_kv_buffers: 2 max_blocks: %d }\n' %
                (PAGE, BLOCK_BYTES, LAYERS, BLOCKS))
    sock = os.path.join(d, "attach.sock")
    daemon = subprocess.Popen(
        shlex.split(os.environ["KVBROKERD"]) + [
         "--backend=cuda", "--listen=",
         "--unix_socket=" + os.path.join(d, "grpc.sock"),
         "--attach_socket=" + sock, "--pools=" + pools,
         "--min_idle_pages=0", "--max_idle_pages=0"],
        stdout=subprocess.PIPE, text=True)
    try:
        while True:
            line = daemon.stdout.readline()
            if not line:
                raise SystemExit("kvbrokerd exited before serving")
            if line.startswith("kvbrokerd:"):
                break
        with engine.Session(sock, holder="bandwidth-bench") as s:
            s.attach("bw")
            blocks = s.alloc(BLOCKS)
            pages = -(-BLOCKS * BLOCK_BYTES // PAGE)
            if s.mapped_pages != pages:
                raise SystemExit(
                    "the engine mapped %d pages of %d: the daemon does not "
                    "send its pages (PagesMapped)" % (s.mapped_pages, pages))
            lay = s.layout
            layer = torch.as_tensor(s.kv_view(layer=0, buffer=0),
                                    device="cuda")
            assert layer.shape == (BLOCKS, lay.block_bytes)
            assert layer.stride() == (lay.block_stride_bytes, 1)

            class Range:
                pass

            whole = Range()
            whole.__cuda_array_interface__ = {
                "shape": (CONTIGUOUS_BYTES,),
                "typestr": "|u1",
                "data": (s.block_address(min(blocks)), False),
                "version": 3,
            }
            contiguous = torch.as_tensor(whole, device="cuda")
            half = torch.as_tensor(
                s.kv_view(layer=0, buffer=0, dtype="float16"), device="cuda")
            wide = torch.as_tensor(
                s.kv_view(layer=0, buffer=0, dtype="int64"), device="cuda")
            # (name, attached destination, baseline strides or None for a
            # contiguous torch.empty)
            rows = [("layer view u8 (strided)", layer, None),
                    ("layer view f16 (strided)", half, None),
                    ("layer view f16 / same strides", half, half.stride()),
                    ("layer view i64 (strided)", wide, None),
                    ("layer view, driver 2-D copy",
                     CopiedBy(layer, driver_copy_2d(torch)), None),
                    ("layer view u8, copy_into",
                     CopiedBy(layer, engine.copy_into), None),
                    ("layer view f16, copy_into",
                     CopiedBy(half, engine.copy_into), None),
                    ("whole blocks (contiguous)", contiguous, None)]
            print("%-28s %10s %12s %12s %8s" %
                  ("destination", "MiB", "attached GB/s", "empty GB/s",
                   "ratio"))
            for name, view, strides in rows:
                if not view.dtype.is_floating_point:
                    src = torch.randint(0, torch.iinfo(view.dtype).max,
                                        view.shape, dtype=view.dtype,
                                        device="cuda")
                else:
                    src = torch.rand(view.shape, device="cuda").to(view.dtype)
                if strides is None:
                    empty = torch.empty(view.shape, dtype=view.dtype,
                                        device="cuda")
                else:
                    empty = torch.empty_strided(view.shape, strides,
                                                dtype=view.dtype,
                                                device="cuda")
                view.copy_(src)
                torch.cuda.synchronize()
                landed = view.view if isinstance(view, CopiedBy) else view
                if not torch.equal(landed, src):
                    raise SystemExit("%s: the copy did not land" % name)
                attached, own = [], []
                for _ in range(ROUNDS):
                    for dst, out in ((view, attached), (empty, own)):
                        dst.copy_(src)  # warm
                        start = torch.cuda.Event(enable_timing=True)
                        end = torch.cuda.Event(enable_timing=True)
                        start.record()
                        for _ in range(COPIES):
                            dst.copy_(src)
                        end.record()
                        end.synchronize()
                        seconds = start.elapsed_time(end) / 1e3
                        out.append(view.numel() * view.element_size() *
                                   COPIES / seconds / 1e9)
                a = sorted(attached)[ROUNDS // 2]
                e = sorted(own)[ROUNDS // 2]
                print("%-28s %10d %12.1f %12.1f %7.3fx" %
                      (name, (view.numel() * view.element_size()) >> 20, a, e,
                       a / e))
                del src, empty
            print("target: layer view >= 0.95x torch.empty (copy_into rows)")
            del rows, layer, half, wide, contiguous
            torch.cuda.synchronize()
            s.free(blocks)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait()
        shutil.rmtree(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
