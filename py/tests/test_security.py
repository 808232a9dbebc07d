"""TLS, mutual TLS and bearer tokens: kvbrokerd started with --tls_cert,
--tls_key, --tls_client_ca and --auth_tokens, and the Python client's
TlsOptions and token. Certificates are made for this run (conftest.certs)."""

import grpc
import pytest

from conftest import MiB
import kvbroker
from kvbroker import KvBrokerClient, RetryPolicy, TlsOptions

ADMIN = "admin-token-0123456789"
ENGINE = "engine-token-0123456789"
ONCE = RetryPolicy(max_attempts=1)
POOL = dict(page_size=2 * MiB, block_bytes=2 * MiB, max_blocks=4)


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("auth") / "tokens.textproto"
    path.write_text(
        f'tokens {{ name: "admin" token: "{ADMIN}" pools: "*" }}\n'
        f'tokens {{ name: "engine-0" token: "{ENGINE}" pools: "mine" }}\n')
    return path


@pytest.fixture(scope="module")
def secure(start_daemon, certs, tokens_file):
    """Mutual TLS on TCP, tokens on both listeners, pools "mine" and
    "theirs"."""
    daemon = start_daemon(f"--tls_cert={certs['server.pem']}",
                          f"--tls_key={certs['server.key']}",
                          f"--tls_client_ca={certs['ca.pem']}",
                          f"--auth_tokens={tokens_file}")
    assert "(mutual TLS)" in daemon.log()
    with daemon.client(token=ADMIN) as admin:
        admin.create_pool("mine", **POOL)
        admin.create_pool("theirs", **POOL)
    return daemon


def mtls(certs, client_cert=True):
    if client_cert:
        return TlsOptions.from_files(certs["ca.pem"], certs["client.pem"],
                                     certs["client.key"])
    return TlsOptions.from_files(certs["ca.pem"])


def test_mutual_tls_with_a_token(secure, certs):
    with KvBrokerClient(secure.tcp, tls=mtls(certs), token=ENGINE) as kvb:
        assert kvb.capacity("mine").available_blocks == 4
        reply = kvb.alloc("mine", 1)
        assert kvbroker.block_ids(reply) == [0]
        kvb.free("mine", [0])


def test_tls_is_required_on_tcp(secure, certs):
    with KvBrokerClient(secure.tcp, token=ENGINE, retry=ONCE) as plain:
        with pytest.raises(kvbroker.TransportError) as info:
            plain.list_pools(timeout=5)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    with KvBrokerClient(secure.tcp, tls=mtls(certs, client_cert=False),
                        token=ENGINE, retry=ONCE) as no_cert:
        with pytest.raises(kvbroker.TransportError) as info:
            no_cert.list_pools(timeout=5)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_server_name_is_checked(secure, certs):
    tls = TlsOptions.from_files(certs["ca.pem"], certs["client.pem"],
                                certs["client.key"],
                                target_name_override="not-the-server")
    with KvBrokerClient(secure.tcp, tls=tls, token=ADMIN, retry=ONCE) as kvb:
        with pytest.raises(kvbroker.TransportError):
            kvb.list_pools(timeout=5)
    ok = TlsOptions.from_files(certs["ca.pem"], certs["client.pem"],
                               certs["client.key"],
                               target_name_override="localhost")
    with KvBrokerClient(secure.tcp, tls=ok, token=ADMIN) as kvb:
        assert [p.spec.name for p in kvb.list_pools()] == ["mine", "theirs"]


@pytest.mark.parametrize("token", [None, "not-a-token-at-all"])
def test_missing_or_unknown_token_is_unauthenticated(secure, token):
    with secure.client(token=token) as kvb:
        with pytest.raises(kvbroker.Unauthenticated) as info:
            kvb.capacity("mine")
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert info.value.attempts == 1
        with pytest.raises(kvbroker.Unauthenticated):
            next(iter(kvb.watch_capacity("mine")))


def test_tokens_are_scoped_to_pools(secure, certs):
    with KvBrokerClient(secure.tcp, tls=mtls(certs), token=ENGINE) as kvb:
        before = kvb.capacity("mine").generation
        with pytest.raises(kvbroker.PermissionDenied) as info:
            kvb.alloc("theirs", 1)
        e = info.value
        assert e.code == grpc.StatusCode.PERMISSION_DENIED
        assert e.metadata["pool"] == "theirs"
        assert e.metadata["token_name"] == "engine-0"
        assert e.metadata["method"] == "Alloc"
        assert ENGINE not in str(e)
        with pytest.raises(kvbroker.PermissionDenied):
            kvb.create_pool("new", **POOL)
        assert [p.spec.name for p in kvb.list_pools()] == ["mine"]
        assert kvb.capacity("mine").generation == before
    with secure.client(token=ADMIN) as admin:
        assert admin.capacity("theirs").allocated_blocks == 0


def test_tls_options_want_a_key_with_a_certificate():
    with pytest.raises(ValueError):
        TlsOptions(root_ca=b"ca", cert=b"cert")


@pytest.mark.parametrize("token", [f"{ENGINE}\n", f"{ENGINE}\x1b",
                                   f"{ENGINE}\u00e9"])
def test_a_token_that_cannot_be_sent_is_refused_without_echoing_it(token):
    # gRPC refused it only at the first call, with a ValueError that
    # printed the secret.
    with pytest.raises(ValueError) as raised:
        KvBrokerClient("127.0.0.1:1", token=token)
    assert ENGINE not in str(raised.value)


def test_an_empty_or_unreadable_tls_file_is_refused(tmp_path):
    # An empty CA file gave root_ca=b"", which is neither "the system's
    # roots" nor a CA: the handshake failed later with a transport error.
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    for field in ("root_ca", "cert", "key"):
        with pytest.raises(ValueError, match="empty.pem"):
            TlsOptions.from_files(**{field: str(empty)})
    with pytest.raises(OSError):
        TlsOptions.from_files(root_ca=str(tmp_path))
