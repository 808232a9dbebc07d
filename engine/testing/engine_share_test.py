"""Two engine processes share a pool's memory through their own mappings:
one writes a distinct pattern into every layer's K and V of the blocks it
holds (per-layer views: numpy on the host backend, torch.as_tensor over
__cuda_array_interface__ on CUDA), a second one attached to the same pool
reads exactly those bytes. After both are killed (SIGKILL) and the pool is
trimmed, the pool maps nothing and, on CUDA, the device's free memory is
back where it was before the engines came.

Needs the daemon to send its mapped pages to attached engines (PagesMapped
at attach and before blocks on a new page are handed out, SPEC section 10).

Runs under pytest on the host backend (//engine:engine_share_py_test), and
as a script on a GPU machine:
    KVB_TEST_BACKEND=cuda KVBROKERD=... KVBROKERCTL=... \\
    KVBROKER_ENGINE_LIBRARY=... PYTHONPATH=py python3 engine_share_test.py
which prints "PASSED", "SKIPPED: why" or "FAILED: why" last and exits 0 only
when it passed or skipped (no torch or no CUDA device). KVBROKERD and
KVBROKERCTL are command lines (a bundle's runner and the binary's name).
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BACKEND = os.environ.get("KVB_TEST_BACKEND", "host")
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "engine_share_worker.py")

# P = 2 MiB, B = 256 KiB, L = 4, K = 2: 8 blocks per page, 16 MiB bundles,
# 64 blocks on 8 pages.
PAGE_BYTES = 2 << 20
BLOCK_BYTES = 256 << 10
LAYERS = 4
BUFFERS = 2
MAX_BLOCKS = 64
BUNDLE_BYTES = PAGE_BYTES * LAYERS * BUFFERS
POOL = """pools { name: "share" page_size: %d block_bytes: %d num_layers: %d
               num_kv_buffers: %d max_blocks: %d tokens_per_block: 16 }
""" % (PAGE_BYTES, BLOCK_BYTES, LAYERS, BUFFERS, MAX_BLOCKS)
WRITTEN_BLOCKS = 20  # 3 pages, the last one partly

# kvbrokerd and kvbrokerctl carry their own sanitizer runtime, if any; the
# engine workers are Python loading the library, so they keep this
# process's environment (a preloaded ASan runtime included).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


class Skip(Exception):
    pass


def device_free_bytes():
    """The device's free memory as the driver reports it (cuMemGetInfo),
    or None on the host backend."""
    if BACKEND != "cuda":
        return None
    import torch
    return torch.cuda.mem_get_info()[0]


def check_environment():
    if BACKEND != "cuda":
        return
    try:
        import torch
    except ImportError:
        raise Skip("no torch")
    if not torch.cuda.is_available():
        raise Skip("no CUDA device")


class Daemon:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="kvb-share-", dir="/tmp")
        pools = os.path.join(self.dir, "pools.textproto")
        with open(pools, "w") as f:
            f.write(POOL)
        self.attach = os.path.join(self.dir, "attach.sock")
        self.grpc = os.path.join(self.dir, "grpc.sock")
        args = shlex.split(os.environ["KVBROKERD"]) + [
                "--backend=" + BACKEND,
                "--listen=", "--unix_socket=" + self.grpc,
                "--attach_socket=" + self.attach, "--pools=" + pools,
                "--min_idle_pages=0", "--max_idle_pages=0"]
        if BACKEND == "host":
            args.append("--host_device_memory=1GiB")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True,
                                     env=CHILD_ENV)
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError("kvbrokerd exited before serving")
            if line.startswith("kvbrokerd:"):
                break

    def ctl(self, *args):
        out = subprocess.run(
            shlex.split(os.environ["KVBROKERCTL"]) +
            ["--server=unix:" + self.grpc, "--json"] + list(args),
            capture_output=True, text=True, env=CHILD_ENV)
        if out.returncode != 0:
            raise AssertionError("kvbrokerctl %s: %s" % (args, out.stderr))
        return json.loads(out.stdout)

    def mapped_bytes(self):
        return int(self.ctl("capacity", "share")["mapped_bytes"])

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait()
        shutil.rmtree(self.dir)


class Engine:
    """An engine_share_worker.py process and the JSON line it printed."""

    def __init__(self, daemon, role, holder, arg):
        self.proc = subprocess.Popen(
            [sys.executable, WORKER, role, daemon.attach, holder, "share",
             str(arg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=os.environ)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise AssertionError("%s engine exited (%d) before reporting" %
                                 (role, self.proc.returncode))
        self.report = json.loads(line)

    def kill(self):
        self.proc.kill()
        self.proc.wait()


def until(predicate, what, timeout=30.0):
    """Waits for `predicate` (the daemon and the driver clean up a killed
    process on their own threads), bounded by `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.05)


def run_share_scenario():
    check_environment()
    daemon = Daemon()
    try:
        assert daemon.mapped_bytes() == 0
        free_before = device_free_bytes()

        writer = Engine(daemon, "write", "writer", WRITTEN_BLOCKS)
        blocks = writer.report["blocks"]
        assert len(blocks) == WRITTEN_BLOCKS
        assert len(set(blocks)) == WRITTEN_BLOCKS
        pages = {b // (PAGE_BYTES // BLOCK_BYTES) for b in blocks}
        assert writer.report["mapped_pages"] >= len(pages), writer.report
        if BACKEND == "cuda":
            # Written with kvbroker.engine.copy_into's compiled copy.
            assert writer.report["compiled_copies"] > 0, writer.report
            # The library's driver calls leave the engine thread's current
            # context as they found it: through the attach (which reserves
            # the range), and the engine's own through an Alloc that mapped
            # pages.
            seen = writer.report["contexts"]
            assert seen["after_attach"] == seen["before_attach"], seen
            assert seen["own"] is not None, seen
            assert seen["after_alloc"] == seen["own"], seen

        reader = Engine(daemon, "read", "reader",
                        ",".join(str(b) for b in blocks))
        assert reader.report["checked_bytes"] == (
            WRITTEN_BLOCKS * LAYERS * BUFFERS * BLOCK_BYTES), reader.report
        assert reader.report["mismatched_bytes"] == 0, reader.report
        assert reader.report["mapped_pages"] >= len(pages), reader.report

        mapped = daemon.mapped_bytes()
        assert mapped >= len(pages) * BUNDLE_BYTES, mapped
        if free_before is not None:
            # The pages are real device memory, counted once however many
            # processes map them.
            in_use = free_before - device_free_bytes()
            assert in_use >= len(pages) * BUNDLE_BYTES, in_use

        writer.kill()
        reader.kill()
        # The writer's blocks are freed when the daemon sees its session
        # end; then a trim unmaps every page.
        until(lambda: int(daemon.ctl("capacity", "share")
                          ["allocated_blocks"]) == 0, "the writer's blocks")
        daemon.ctl("trim", "share")
        until(lambda: daemon.mapped_bytes() == 0, "the pool to unmap")
        if free_before is not None:
            # The driver frees a dead importer's handles on its own. One
            # granule of slack for the driver's own bookkeeping.
            until(lambda: device_free_bytes() >= free_before - PAGE_BYTES,
                  "the device's free memory (%d before)" % free_before)
            print("device free bytes: %d before, %d after" %
                  (free_before, device_free_bytes()))
    finally:
        daemon.stop()


def test_engines_share_pages_and_give_them_back():
    run_share_scenario()


if __name__ == "__main__":
    from script_verdict import run_as_script
    run_as_script(run_share_scenario, Skip)
