"""An engine process for engine_share_test.py: attaches to a pool with
kvbroker.engine and writes (or reads) every layer's K and V of its blocks
through per-layer views, with torch on CUDA or numpy on the host backend.

    engine_share_worker.py write SOCKET HOLDER POOL NUM_BLOCKS
        allocates NUM_BLOCKS blocks and writes pattern(block, layer, buffer)
        into each (on CUDA each run of consecutive blocks at once, with
        kvbroker.engine.copy_into); prints {"blocks": [...],
        "mapped_pages": N}, and on CUDA "contexts": the thread's current
        CUDA context before and after the attach, a context of its own made
        current before the Alloc that maps the pages, and the one current
        after it
    engine_share_worker.py read SOCKET HOLDER POOL BLOCK,BLOCK,...
        allocates nothing; compares each named block's bytes with the
        pattern through its own mapping; prints {"checked_bytes": N,
        "mismatched_bytes": M, "mapped_pages": N}

Then it waits for stdin to close (or to be killed). On CUDA it imports torch
before kvbroker.engine, as an engine process would.
"""

import json
import os
import sys

BACKEND = os.environ.get("KVB_TEST_BACKEND", "host")
if BACKEND == "cuda":
    import torch  # first: the library shares the process with PyTorch's own
else:
    import numpy

from kvbroker import engine  # noqa: E402


def pattern_offset(block, layer, buffer):
    return (block * 31 + layer * 7 + buffer * 3) % 251


def pattern(block_bytes, offset):
    """Byte i of the pattern is (i + offset) % 251, on the backend's device."""
    if BACKEND == "cuda":
        i = torch.arange(block_bytes, dtype=torch.int64, device="cuda")
        return ((i + offset) % 251).to(torch.uint8)
    i = numpy.arange(block_bytes, dtype=numpy.int64)
    return ((i + offset) % 251).astype(numpy.uint8)


def runs(blocks):
    """[(first, end)] of the runs of consecutive ids in `blocks`."""
    out = []
    for b in sorted(blocks):
        if out and out[-1][1] == b:
            out[-1][1] = b + 1
        else:
            out.append([b, b + 1])
    return out


class Contexts:
    """The calling thread's CUDA contexts through the driver (ctypes), to
    see whether the engine library leaves them as it found them."""

    def __init__(self):
        import ctypes
        self.c = ctypes
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.check(self.cuda.cuInit(0), "cuInit")

    def check(self, rc, call):
        if rc != 0:
            raise SystemExit("%s: CUDA error %d" % (call, rc))

    def current(self):
        ctx = self.c.c_void_p()
        self.check(self.cuda.cuCtxGetCurrent(self.c.byref(ctx)),
                   "cuCtxGetCurrent")
        return ctx.value

    def push_own(self):
        """Creates a context on device 0 (not its primary one) and makes it
        current; returns it."""
        dev = self.c.c_int()
        self.check(self.cuda.cuDeviceGet(self.c.byref(dev), 0), "cuDeviceGet")
        ctx = self.c.c_void_p()
        self.check(self.cuda.cuCtxCreate_v2(self.c.byref(ctx), 0, dev),
                   "cuCtxCreate")
        return ctx.value

    def pop_and_destroy(self, ctx):
        popped = self.c.c_void_p()
        self.check(self.cuda.cuCtxPopCurrent_v2(self.c.byref(popped)),
                   "cuCtxPopCurrent")
        self.check(self.cuda.cuCtxDestroy_v2(self.c.c_void_p(ctx)),
                   "cuCtxDestroy")


def layer_views(session):
    """{(layer, buffer): tensor or array of shape (max_blocks, block_bytes)}
    over the session's mapping, without a copy."""
    lay = session.layout
    views = {}
    for layer in range(lay.num_layers):
        for buffer in range(lay.num_kv_buffers):
            view = session.kv_view(layer=layer, buffer=buffer, dtype="uint8")
            if BACKEND == "cuda":
                views[layer, buffer] = torch.as_tensor(view, device="cuda")
            else:
                views[layer, buffer] = numpy.asarray(view)
    return views


def main(argv):
    role, socket_path, holder, pool, arg = argv[1:6]
    contexts = Contexts() if BACKEND == "cuda" and role == "write" else None
    seen = {}
    if contexts:
        seen["before_attach"] = contexts.current()
    session = engine.Session(socket_path, holder=holder)
    session.attach(pool)
    lay = session.layout
    per_page = lay.page_size // lay.block_bytes
    if role == "write":
        if contexts:
            seen["after_attach"] = contexts.current()
            seen["own"] = contexts.push_own()
        blocks = session.alloc(int(arg))
        if contexts:
            seen["after_alloc"] = contexts.current()
            contexts.pop_and_destroy(seen["own"])
        need = len({b // per_page for b in blocks})
        if session.mapped_pages < need:
            # Touching a page that is not mapped here would crash.
            raise SystemExit("the daemon sent %d pages; blocks %s need %d" %
                             (session.mapped_pages, blocks, need))
        # torch.as_tensor asks the driver about the view's first byte, so
        # the views are made once the pages under the blocks are mapped.
        views = layer_views(session)
        for (layer, buffer), view in views.items():
            if BACKEND == "cuda":
                for first, end in runs(blocks):
                    engine.copy_into(view[first:end], torch.stack([
                        pattern(lay.block_bytes,
                                pattern_offset(b, layer, buffer))
                        for b in range(first, end)]))
            else:
                for b in blocks:
                    view[b] = pattern(lay.block_bytes,
                                      pattern_offset(b, layer, buffer))
        if BACKEND == "cuda":
            torch.cuda.synchronize()
        out = {"blocks": blocks, "mapped_pages": session.mapped_pages}
        if BACKEND == "cuda":
            # How many of the copies took copy_into's compiled path.
            out["compiled_copies"] = engine._compiled_copies
            out["contexts"] = seen
    elif role == "read":
        blocks = [int(b) for b in arg.split(",")]
        need = len({b // per_page for b in blocks})
        if session.mapped_pages < need:
            raise SystemExit("the daemon sent %d pages; blocks %s need %d" %
                             (session.mapped_pages, blocks, need))
        views = layer_views(session)
        checked = mismatched = 0
        for (layer, buffer), view in views.items():
            for b in blocks:
                want = pattern(lay.block_bytes,
                               pattern_offset(b, layer, buffer))
                diff = view[b] != want
                mismatched += int(diff.sum())
                checked += lay.block_bytes
        out = {"checked_bytes": checked, "mismatched_bytes": mismatched,
               "mapped_pages": session.mapped_pages}
    else:
        raise SystemExit("unknown role %r" % role)
    print(json.dumps(out), flush=True)
    sys.stdin.read()  # hold the session until told to go or killed
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
