"""kvbroker.engine.copy_into on a CUDA device with the machine's PyTorch:
every copy lands exactly as dst.copy_(src) would, whether it took the
compiled path (a layer view, a slice of one, float16 blocks of a
multi-dimensional shape) or PyTorch's own (rows that are not whole 8-byte
words, a contiguous destination, a copy autograd records, a CPU tensor), and
the compiled path is the one a layer view takes. The memory is PyTorch's own
with the layout's strides: engine_share_test.py writes attached memory this
way, across processes.

As a script on a GPU machine (tools/gpu-run):
    PYTHONPATH=py python3 copy_into_test.py
prints "PASSED", "SKIPPED: why" or "FAILED: why" last and exits 0 only when
it passed or skipped (no torch or no CUDA device).
"""

from kvbroker import engine


class Skip(Exception):
    pass


LAYERS_TIMES_BUFFERS = 4
BLOCKS = 24


def strided(torch, pool, dtype, block_bytes, block_shape=None):
    """Layer 1's K of a block-major pool of BLOCKS blocks in `pool`."""
    size = torch.empty((), dtype=dtype).element_size()
    shape = block_shape or (block_bytes // size,)
    inner, step = [], 1
    for d in reversed(shape):
        inner.insert(0, step)
        step *= d
    stride = block_bytes * LAYERS_TIMES_BUFFERS // size
    return pool.view(dtype)[2 * block_bytes // size:].as_strided(
        (BLOCKS,) + tuple(shape), (stride,) + tuple(inner))


def expect_copy(torch, pool, dst, src, compiled):
    """copy_into(dst, src) changes exactly the bytes dst.copy_(src) would;
    `compiled`: whether it must have taken the compiled path."""
    expected = pool.clone()
    expected.view(dst.dtype).as_strided(
        dst.shape, dst.stride(), dst.storage_offset()).copy_(src)
    copies = engine._compiled_copies
    assert engine.copy_into(dst, src) is dst
    torch.cuda.synchronize()
    assert torch.equal(dst, src), "the copy did not land"
    assert torch.equal(pool, expected), "bytes outside dst changed"
    took = engine._compiled_copies != copies
    assert took == compiled, "copy_into %s the compiled copy" % (
        "did not take" if compiled else "took")


def run():
    try:
        import torch
    except ImportError:
        raise Skip("no torch")
    if not torch.cuda.is_available():
        raise Skip("no CUDA device")
    cuda = torch.device("cuda")
    block = 64 << 10
    pool = torch.zeros(block * LAYERS_TIMES_BUFFERS * (BLOCKS + 1),
                       dtype=torch.uint8, device=cuda)

    def rand(shape, dtype):
        return torch.randint(0, 120, shape, dtype=torch.int16,
                             device=cuda).to(dtype)

    # The compiled path: a layer view, a slice of one, float16 blocks of 16
    # tokens x 8 heads x 256 (one kernel, dynamic shapes), a strided source.
    view = strided(torch, pool, torch.uint8, block)
    expect_copy(torch, pool, view, rand(view.shape, torch.uint8), True)
    expect_copy(torch, pool, view[5:17], rand((12, block), torch.uint8), True)
    half = strided(torch, pool, torch.float16, block, (16, 8, 256))
    expect_copy(torch, pool, half[3:9], rand((6, 16, 8, 256), torch.float16),
                True)
    source = rand((24, 2 * block), torch.uint8)[:, :block]
    expect_copy(torch, pool, view, source, True)
    # PyTorch's own copy: rows of 12 bytes, a contiguous destination,
    # another dtype.
    rows12 = pool[:4 * 4096].as_strided((4, 12), (4096, 1))
    expect_copy(torch, pool, rows12, rand((4, 12), torch.uint8), False)
    flat = pool[:4 * block].view(4, block)
    expect_copy(torch, pool, flat, rand((4, block), torch.uint8), False)
    calls = engine._compiled_copies
    engine.copy_into(view, rand(view.shape, torch.int16)[:, :block])
    torch.cuda.synchronize()
    assert engine._compiled_copies == calls, "a converting copy was compiled"
    # A CPU tensor.
    cpu = torch.zeros(8, 64, dtype=torch.uint8)[:, :32]
    engine.copy_into(cpu, torch.ones(8, 32, dtype=torch.uint8))
    assert int(cpu.sum()) == 8 * 32
    # A source autograd tracks: compiled only with grad off (last: the copy
    # with grad on puts the pool in autograd's graph).
    weights = rand((BLOCKS, block // 4), torch.float32).requires_grad_()
    f32 = strided(torch, pool, torch.float32, block)
    with torch.no_grad():
        expect_copy(torch, pool, f32, weights, True)
    calls = engine._compiled_copies
    engine.copy_into(f32, weights * 2)
    torch.cuda.synchronize()
    assert engine._compiled_copies == calls, "autograd's copy was compiled"
    assert torch.equal(f32.detach(), (weights * 2).detach())


if __name__ == "__main__":
    from script_verdict import run_as_script
    run_as_script(run, Skip)
