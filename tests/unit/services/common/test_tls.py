"""TLS and mTLS on a real gRPC server (GrpcServer, as every service builds it) with certificates made here: who gets
through and who does not, and the settings' own checks."""

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common import tls
from services.common.grpc_server import GrpcServer, make_channel
from services.common.settings import SettingsError
from tests.tls_certs import make_authority, tls_env


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    ca, rogue = make_authority(root / "ca"), make_authority(root / "rogue", "rogue-ca")
    return {
        "ca": ca,
        "server": ca.issue("server"),
        "client": ca.issue("client"),
        "rogue": rogue.issue("intruder"),
        "rogue_ca": rogue,
    }


@pytest.fixture
async def serve(monkeypatch, pki):
    """Start a GrpcServer configured through TANDEM_GRPC_TLS_* (as a service reads them); yields its address."""
    servers = []

    async def start(client_auth: bool) -> str:
        for name, value in tls_env(pki["ca"].cert, pki["server"], client_auth).items():
            monkeypatch.setenv(name, value)
        tls.process_tls.cache_clear()
        server = GrpcServer("127.0.0.1:0", ["tandem.test"])
        await server.start()
        servers.append(server)
        return f"127.0.0.1:{server.port}"

    yield start
    for server in servers:
        await server.stop(0)
    tls.process_tls.cache_clear()


async def _check(channel: grpc.aio.Channel) -> str:
    """SERVING, or the failing status code's name."""
    async with channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def _client(address: str, ca, leaf=None) -> grpc.aio.Channel:
    creds = tls.GrpcTls(cert=str(leaf.cert) if leaf else "", key=str(leaf.key) if leaf else "", ca=str(ca))
    return grpc.aio.secure_channel(address, creds.channel_credentials())


async def test_tls_server_takes_clients_that_trust_its_ca_and_refuses_plaintext(serve, pki):
    address = await serve(client_auth=False)
    assert await _check(_client(address, pki["ca"].cert)) == "SERVING"
    assert await _check(grpc.aio.insecure_channel(address)) == "UNAVAILABLE"
    assert await _check(_client(address, pki["rogue_ca"].cert)) == "UNAVAILABLE"  # the server is not who it trusts


async def test_mtls_server_wants_a_client_certificate_from_its_ca(serve, pki):
    address = await serve(client_auth=True)
    assert await _check(_client(address, pki["ca"].cert, pki["client"])) == "SERVING"
    assert await _check(_client(address, pki["ca"].cert)) == "UNAVAILABLE"  # no certificate
    assert await _check(_client(address, pki["ca"].cert, pki["rogue"])) == "UNAVAILABLE"  # one nobody signed here


async def test_make_channel_follows_the_environment(serve, pki):
    address = await serve(client_auth=True)  # NOTE: the env now names the server's certificate: valid as a client
    assert await _check(make_channel(address)) == "SERVING"


def test_settings_refuse_half_or_missing_configurations(pki, tmp_path):
    ca, leaf = str(pki["ca"].cert), pki["client"]
    assert not tls.GrpcTls().is_enabled
    assert tls.GrpcTls(ca=ca).is_enabled  # a client that checks servers, with no certificate of its own
    with pytest.raises(SettingsError, match="go together"):
        tls.GrpcTls(cert=str(leaf.cert), ca=ca)
    with pytest.raises(SettingsError, match="CLIENT_AUTH"):
        tls.GrpcTls(ca=ca, client_auth=True)
    with pytest.raises(SettingsError, match="CA is required"):
        tls.GrpcTls(cert=str(leaf.cert), key=str(leaf.key))
    with pytest.raises(SettingsError, match="not a readable file"):
        tls.GrpcTls(ca=str(tmp_path / "missing.crt"))
    with pytest.raises(SettingsError, match="needs TANDEM_GRPC_TLS_CERT"):
        tls.GrpcTls(ca=ca).server_credentials()


def test_a_bad_setting_stops_a_service_with_exit_code_2(monkeypatch, capsys, tmp_path):
    from services.router.server import main

    monkeypatch.setenv("TANDEM_GRPC_TLS_CA", str(tmp_path / "nowhere.crt"))
    tls.process_tls.cache_clear()
    try:
        assert main(["--port", "0"]) == 2
    finally:
        tls.process_tls.cache_clear()
    assert "TANDEM_GRPC_TLS_CA" in capsys.readouterr().err
