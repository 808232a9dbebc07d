"""strided_copy_bench: how fast can a copy into a layer view of the
block-major layout (SPEC section 10) be, on PyTorch's own memory?

A layer view is one row of block_bytes per block, block_bytes x layers x
buffers apart. For several block sizes (32 layers, K and V, 512 MiB copied),
on one 32 GiB torch.empty viewed with those strides, each against a
contiguous copy of the same bytes:

  - torch copies into the view as float16 and as int64 (the widest element
    PyTorch's strided copy kernel moves a thread at a time);
  - the float16 copy compiled by torch.compile (Inductor's Triton kernel);
  - kvbroker.engine.copy_into (the view as rows of 8-byte words, copied by a
    torch.compile'd copy with dynamic shapes);
  - the driver's own 2-D copy (cuMemcpy2DAsync, rows at the view's pitch).

No daemon is involved: engine_bandwidth_bench.py shows that attached memory
copies exactly as fast as PyTorch's own with the same strides; this bench
shows what the strides alone allow, copy by copy. Medians of seven rounds of
ten copies (CUDA events).

    PYTHONPATH=py python3 bench/strided_copy_bench.py

Prints "SKIPPED: why" and exits 0 without torch or a CUDA device.
"""

import sys

from engine_bandwidth_bench import cuda_torch, driver_copy_2d

LAYERS_TIMES_BUFFERS = 64  # 32 layers, K and V
POOL_BYTES = 32 << 30
ROW_BYTES = (16 << 10, 32 << 10, 64 << 10, 256 << 10, 2 << 20)
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
    torch = cuda_torch()
    if torch is None:
        return 0
    import torch._dynamo
    from kvbroker import engine

    # One compilation per row size for the float16 column (dynamic=False).
    torch._dynamo.config.cache_size_limit = max(
        torch._dynamo.config.cache_size_limit, 2 * len(ROW_BYTES))
    compiled_f16 = torch.compile(lambda dst, src: dst.copy_(src),
                                 dynamic=False)
    by_driver = driver_copy_2d(torch)
    print(torch.__version__, torch.cuda.get_device_name())
    pool = torch.empty(POOL_BYTES, dtype=torch.uint8, device="cuda")
    columns = ("f16 strided", "f16 compiled", "i64 strided", "copy_into",
               "driver 2-D")
    print("%9s %7s" % ("row KiB", "rows") +
          "".join(" %14s" % c for c in columns) + " %10s" % "contiguous")
    for row in ROW_BYTES:
        stride = row * LAYERS_TIMES_BUFFERS
        rows = POOL_BYTES // stride
        nbytes = rows * row

        def strided(dtype):
            size = torch.empty((), dtype=dtype).element_size()
            return pool.view(dtype).as_strided((rows, row // size),
                                               (stride // size, 1))

        f16, i64, u8 = (strided(torch.float16), strided(torch.int64),
                        strided(torch.uint8))
        src = torch.randint(0, 127, (rows, row // 2), dtype=torch.int16,
                            device="cuda").to(torch.float16)
        src64, src8 = src.view(torch.int64), src.view(torch.uint8)
        copies = {
            "f16 strided": (f16, lambda: f16.copy_(src)),
            "f16 compiled": (f16, lambda: compiled_f16(f16, src)),
            "i64 strided": (i64, lambda: i64.copy_(src64)),
            "copy_into": (f16, lambda: engine.copy_into(f16, src)),
            "driver 2-D": (u8, lambda: by_driver(u8, src8)),
        }
        rates = {}
        for name, (view, copy) in copies.items():
            pool.zero_()
            copy()
            torch.cuda.synchronize()
            if not torch.equal(f16, src):
                raise SystemExit("%s: the copy did not land" % name)
            rates[name] = median_gbps(torch, copy, nbytes)
        flat = torch.empty_like(src)
        contiguous = median_gbps(torch, lambda: flat.copy_(src), nbytes)
        print("%9d %7d" % (row >> 10, rows) +
              "".join(" %7.0f %.3fx" % (rates[c], rates[c] / contiguous)
                      for c in columns) + " %5.0f GB/s" % contiguous)
        del src, src64, src8, flat, f16, i64, u8
    return 0


if __name__ == "__main__":
    sys.exit(main())
