"""strided_copy_bench: how fast can anything copy into a layer view of the
block-major layout (SPEC section 10), on PyTorch's own memory?

A layer view is one row of block_bytes per block, block_bytes x layers x
buffers apart. For several block sizes (the pool's layers and buffers and the
bytes copied fixed), on one 32 GiB torch.empty viewed with those strides:

  - torch copies into the view as float16 and as int64 (the widest element
    PyTorch's strided copy kernel moves a thread at a time);
  - the driver's own 2-D copy (cuMemcpy2DAsync, rows at the view's pitch);

each against a contiguous copy of the same bytes. No daemon is involved:
engine_bandwidth_bench.py shows that attached memory copies exactly as fast
as PyTorch's own with the same strides; this bench shows where the strides
alone put the ceiling. Medians of seven rounds of ten copies (CUDA events).

    python3 bench/strided_copy_bench.py

Prints "SKIPPED: why" and exits 0 without torch or a CUDA device.
"""

import sys

from engine_bandwidth_bench import Copy2D

LAYERS_TIMES_BUFFERS = 64  # 32 layers, K and V
POOL_BYTES = 32 << 30
ROW_BYTES = (16 << 10, 64 << 10, 256 << 10, 2 << 20)
ROUNDS = 7
COPIES = 10


def median_gbps(torch, copy, nbytes):
    rates = []
    for _ in range(ROUNDS):
        copy()  # warm
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(COPIES):
            copy()
        end.record()
        end.synchronize()
        rates.append(nbytes * COPIES / (start.elapsed_time(end) / 1e3) / 1e9)
    return sorted(rates)[ROUNDS // 2]


def main():
    try:
        import torch
    except ImportError:
        print("SKIPPED: no torch")
        return 0
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return 0
    print(torch.__version__, torch.cuda.get_device_name())
    pool = torch.empty(POOL_BYTES, dtype=torch.uint8, device="cuda")
    print("%9s %7s %14s %14s %14s %14s" %
          ("row KiB", "rows", "f16 strided", "i64 strided", "driver 2-D",
           "contiguous"))
    for row in ROW_BYTES:
        stride = row * LAYERS_TIMES_BUFFERS
        rows = POOL_BYTES // stride
        nbytes = rows * row
        rates = {}
        for dtype in (torch.float16, torch.int64):
            size = torch.empty((), dtype=dtype).element_size()
            view = pool.view(dtype).as_strided((rows, row // size),
                                               (stride // size, 1))
            src = torch.randint(0, 127, view.shape, dtype=torch.int16,
                                device="cuda").to(dtype)
            view.copy_(src)
            torch.cuda.synchronize()
            if not torch.equal(view, src):
                raise SystemExit("the strided copy did not land")
            rates[dtype] = median_gbps(torch, lambda: view.copy_(src), nbytes)
            if dtype == torch.int64:
                flat = torch.empty_like(src)
                rates["contiguous"] = median_gbps(
                    torch, lambda: flat.copy_(src), nbytes)
                by_driver = Copy2D(torch, pool.as_strided((rows, row),
                                                          (stride, 1)))
                u8 = src.view(torch.uint8)
                pool.zero_()
                by_driver.copy_(u8)
                torch.cuda.synchronize()
                if not torch.equal(by_driver.view, u8):
                    raise SystemExit("the driver's 2-D copy did not land")
                rates["driver"] = median_gbps(
                    torch, lambda: by_driver.copy_(u8), nbytes)
                del flat, u8
            del view, src
        c = rates["contiguous"]
        print("%9d %7d %8.0f %.3fx %8.0f %.3fx %8.0f %.3fx %8.0f GB/s" %
              (row >> 10, rows, rates[torch.float16],
               rates[torch.float16] / c, rates[torch.int64],
               rates[torch.int64] / c, rates["driver"], rates["driver"] / c,
               c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
