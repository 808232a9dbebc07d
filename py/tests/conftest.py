"""Fixtures: real kvbrokerd processes (host backend) on a free TCP port and a
Unix socket in a temporary directory, test certificates made with openssl,
and unique pool names.

The daemon binary is $KVBROKERD (Bazel's runner sets it), else
bazel-bin/server/kvbrokerd of this checkout. Every daemon a test starts must
still be alive at the end and exit 0 on SIGTERM: no call may crash it.
"""

import itertools
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from kvbroker import KvBrokerClient

MiB = 1 << 20
REPO = pathlib.Path(__file__).resolve().parents[2]
KVBROKERD = (os.environ.get("KVBROKERD") or
             str(REPO / "bazel-bin/server/kvbrokerd"))
# Generous: under ASan a daemon starts in seconds, not milliseconds.
START_TIMEOUT_S = 60


class Daemon:
    """One kvbrokerd process. ``tcp`` is "127.0.0.1:PORT", ``unix`` is
    "unix:/tmp/.../kvbrokerd.sock"."""

    def __init__(self, workdir: pathlib.Path, flags):
        self.workdir = workdir
        self.socket = workdir / "kvbrokerd.sock"
        self._out = workdir / "kvbrokerd.out"
        self._err = workdir / "kvbrokerd.log"
        argv = [KVBROKERD, "--backend=host", "--listen=127.0.0.1:0",
                f"--unix_socket={self.socket}", "--min_idle_pages=0",
                "--max_idle_pages=0", *flags]
        with open(self._out, "wb") as out, open(self._err, "wb") as err:
            self.process = subprocess.Popen(argv, stdout=out, stderr=err)
        self.tcp = self._wait_for_address()
        self.unix = f"unix:{self.socket}"

    def _wait_for_address(self) -> str:
        end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < end:
            match = re.search(r" on (127\.0\.0\.1:\d+)", self._out.read_text())
            if match:
                return match.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.02)
        self.process.kill()
        raise RuntimeError(f"kvbrokerd did not start:\n{self.log()}")

    def log(self) -> str:
        return self._out.read_text() + self._err.read_text()

    def client(self, transport: str = "unix", **options) -> KvBrokerClient:
        """A client already connected: a first call that is not retried
        (create_pool) must not meet a failed first connection attempt."""
        target = self.unix if transport == "unix" else self.tcp
        client = KvBrokerClient(target, **options)
        client.wait_ready(START_TIMEOUT_S)
        return client

    def stop(self) -> int:
        """SIGTERM, then the exit status (the daemon drains and exits 0)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def short_tmpdir(prefix: str) -> pathlib.Path:
    # Unix socket paths are limited to 107 bytes; Bazel's TEST_TMPDIR is long.
    return pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@pytest.fixture(scope="module")
def start_daemon():
    """``start_daemon(*flags) -> Daemon``; stopped (and checked) at the end
    of the module."""
    started = []

    def start(*flags):
        daemon = Daemon(short_tmpdir("kvbpy-"), flags)
        started.append(daemon)
        return daemon

    yield start
    failures = []
    for daemon in started:
        alive = daemon.process.poll() is None
        rc = daemon.stop()
        if not alive or rc != 0:
            failures.append(f"kvbrokerd exited {rc} (alive before SIGTERM: "
                            f"{alive}):\n{daemon.log()}")
        shutil.rmtree(daemon.workdir, ignore_errors=True)

    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def daemon(start_daemon):
    """The module's shared daemon: host backend, 80 GiB per device."""
    return start_daemon()


_pool_numbers = itertools.count()


@pytest.fixture
def pool_name():
    """A pool name no other test uses."""
    return f"py{next(_pool_numbers)}"


@pytest.fixture(scope="session")
def certs():
    """A CA, a server certificate for localhost and 127.0.0.1, and a client
    certificate, made with openssl for this run: a dict of file paths."""
    workdir = short_tmpdir("kvbcerts-")
    files = {name: str(workdir / name) for name in (
        "ca.pem", "ca.key", "server.pem", "server.key", "client.pem",
        "client.key", "san.ext")}

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", files["ca.key"], "-out",
            files["ca.pem"], "-days", "2", "-subj", "/CN=kvbroker test CA")
    pathlib.Path(files["san.ext"]).write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for who, cn in (("server", "localhost"),
                    ("client", "kvbroker test client")):
        csr = str(workdir / f"{who}.csr")
        openssl("req", "-new", *ec, "-keyout", files[f"{who}.key"], "-out",
                csr, "-subj", f"/CN={cn}")
        openssl("x509", "-req", "-in", csr, "-CA", files["ca.pem"], "-CAkey",
                files["ca.key"], "-CAcreateserial", "-days", "2", "-out",
                files[f"{who}.pem"], "-extfile", files["san.ext"])
    yield files
    shutil.rmtree(workdir, ignore_errors=True)
