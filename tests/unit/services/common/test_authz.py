"""Per-method authorization: the table covers every RPC in the protos, says what issue 24 says, and the interceptor
enforces it on a real mTLS server (GrpcServer, as every service builds it) for each kind of caller."""

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from services.common import authz, tls
from services.common.grpc_server import GrpcServer
from services.common.identity import Identity
from services.common.peer import require_worker
from services.common.protos import (
    common_pb2,
    planner_pb2,
    router_pb2,
    router_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from tandem.certs import pki

ALL = [
    (service.full_name, method.name)
    for module in (router_pb2, worker_pb2, planner_pb2)
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]


def test_every_rpc_in_the_protos_has_an_entry_and_every_entry_is_an_rpc():
    assert len(ALL) > 15
    missing = [f"{s}/{m}" for s, m in ALL if m not in authz.TABLE.get(s, {})]
    assert not missing, f"add these to services/common/authz.py's TABLE: {missing}"
    tandem_entries = {(s, m) for s, methods in authz.TABLE.items() if s.startswith("tandem.") for m in methods}
    assert tandem_entries == set(ALL)
    assert all(
        roles and roles <= {"gateway", "router", "prefill", "decode", "planner", "operator"}
        for methods in authz.TABLE.values()
        for roles in methods.values()
    )


@pytest.mark.parametrize(
    "method, roles",
    [
        ("/tandem.v1.Router/Register", {"prefill", "decode"}),
        ("/tandem.v1.Router/Heartbeat", {"prefill", "decode"}),
        ("/tandem.v1.Router/Deregister", {"prefill", "decode"}),
        ("/tandem.v1.Router/Route", {"gateway"}),
        ("/tandem.v1.Router/Complete", {"gateway"}),
        ("/tandem.v1.Router/ReportFailure", {"gateway"}),
        ("/tandem.v1.Router/RouteStream", {"gateway"}),
        ("/tandem.v1.PrefillWorker/Prefill", {"gateway"}),
        ("/tandem.v1.DecodeWorker/Generate", {"gateway"}),
        ("/tandem.v1.PrefillWorker/PullKv", {"decode"}),
        ("/tandem.v1.PrefillWorker/PullKvStream", {"decode"}),
        ("/tandem.v1.WorkerControl/ResetPrefixCache", {"planner", "operator"}),
        ("/tandem.v1.Planner/GetPlan", {"planner", "operator"}),
    ],
)
def test_the_table_says_what_the_issue_says(method, roles):
    assert authz.allowed_roles(method) == roles
    for role in ("gateway", "router", "prefill", "decode", "planner", "operator"):
        assert authz.is_allowed(method, Identity(role, "x")) == (role in roles)
    assert not authz.is_allowed(method, None)


def test_health_is_open_and_unknown_methods_are_closed():
    assert authz.is_allowed("/grpc.health.v1.Health/Check", None)
    assert not authz.is_allowed("/tandem.v1.Router/Nope", Identity("operator", "op"))
    assert not authz.is_allowed("garbage", Identity("operator", "op"))
    assert authz.split_method("/a.B/C") == ("a.B", "C") and authz.split_method("a/b") == ("", "")


class FakeRouter(router_pb2_grpc.RouterServicer):
    async def Register(self, request, context):
        await require_worker(context, request.worker.worker_id, "decode")
        return router_pb2.RegisterResponse(lease_ttl_s=1.0)

    async def ListWorkers(self, request, context):
        return router_pb2.ListWorkersResponse()

    async def RouteStream(self, request_iterator, context):
        async for message in request_iterator:
            await context.write(router_pb2.RouteStreamResponse(call_id=message.call_id))


class FakePrefill(worker_pb2_grpc.PrefillWorkerServicer):
    async def PullKvStream(self, request_iterator, context):
        async for message in request_iterator:
            await context.write(worker_pb2.PullKvStreamResponse(call_id=message.call_id, end=worker_pb2.PullKvEnd()))


class FakeControl(worker_pb2_grpc.WorkerControlServicer):
    async def StreamLoad(self, request, context):
        for i in range(3):
            yield common_pb2.WorkerLoad(num_waiting=i)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    ca = pki.new_authority()
    pki.save_authority(root, ca)
    files = {
        f"{i.role}/{i.id}": pki.write_identity(root, ca, i)
        for i in [
            Identity("router", "router"),
            Identity("gateway", "gateway"),
            Identity("decode", "decode-0"),
            Identity("decode", "*"),
            Identity("operator", "operator"),
            Identity("prefill", "prefill-0"),
        ]
    }
    rogue_root = tmp_path_factory.mktemp("rogue")
    files["rogue"] = pki.write_identity(rogue_root, pki.new_authority("rogue"), Identity("operator", "operator"))
    return files


@pytest.fixture
async def server(monkeypatch, certs):
    for name, value in certs["router/router"].env().items():
        monkeypatch.setenv(name, value)
    tls.process_tls.cache_clear()
    registry = CollectorRegistry()
    server = GrpcServer("127.0.0.1:0", ["tandem.v1.Router"], registry)
    router_pb2_grpc.add_RouterServicer_to_server(FakeRouter(), server.server)
    worker_pb2_grpc.add_WorkerControlServicer_to_server(FakeControl(), server.server)
    worker_pb2_grpc.add_PrefillWorkerServicer_to_server(FakePrefill(), server.server)
    await server.start()
    yield f"127.0.0.1:{server.port}", registry
    await server.stop(0)
    tls.process_tls.cache_clear()


def _channel(address: str, files: pki.IdentityFiles | None, ca: pki.IdentityFiles) -> grpc.aio.Channel:
    creds = tls.GrpcTls(cert=str(files.cert) if files else "", key=str(files.key) if files else "", ca=str(ca.ca))
    return grpc.aio.secure_channel(address, creds.channel_credentials())


async def _code(call) -> str:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return "OK"


def _register(worker_id: str) -> router_pb2.RegisterRequest:
    return router_pb2.RegisterRequest(worker=router_pb2.WorkerInfo(worker_id=worker_id))


async def test_interceptor_admits_roles_in_the_table_and_refuses_the_rest(server, certs):
    address, registry = server
    ca = certs["router/router"]
    as_ = {name: router_pb2_grpc.RouterStub(_channel(address, certs[name], ca)) for name in certs if name != "rogue"}
    assert await _code(as_["decode/decode-0"].Register(_register("decode-0"), timeout=5)) == "OK"
    assert await _code(as_["decode/*"].Register(_register("decode-7"), timeout=5)) == "OK"  # role-wide: any id
    assert await _code(as_["decode/decode-0"].Register(_register("decode-1"), timeout=5)) == "PERMISSION_DENIED"
    assert await _code(as_["prefill/prefill-0"].Register(_register("prefill-0"), timeout=5)) == "PERMISSION_DENIED"
    assert await _code(as_["gateway/gateway"].Register(_register("gateway"), timeout=5)) == "PERMISSION_DENIED"
    assert await _code(as_["operator/operator"].ListWorkers(router_pb2.ListWorkersRequest(), timeout=5)) == "OK"
    assert (
        await _code(as_["router/router"].ListWorkers(router_pb2.ListWorkersRequest(), timeout=5)) == "PERMISSION_DENIED"
    )
    denied = registry.get_sample_value(
        "tandem_grpc_denied_total", {"service": "tandem.v1.Router", "method": "Register", "role": "gateway"}
    )
    assert denied == 1.0


async def test_streams_are_guarded_too_and_health_stays_open(server, certs):
    address, _ = server
    ca = certs["router/router"]
    router = worker_pb2_grpc.WorkerControlStub(_channel(address, certs["router/router"], ca))
    assert [m.num_waiting async for m in router.StreamLoad(worker_pb2.StreamLoadRequest(), timeout=5)] == [0, 1, 2]
    gateway = worker_pb2_grpc.WorkerControlStub(_channel(address, certs["gateway/gateway"], ca))
    assert await _code(_drain(gateway.StreamLoad(worker_pb2.StreamLoadRequest(), timeout=5))) == "PERMISSION_DENIED"
    health = health_pb2_grpc.HealthStub(_channel(address, certs["gateway/gateway"], ca))
    assert (
        await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
    ).status == health_pb2.HealthCheckResponse.SERVING


async def _one_route_message(stub) -> str:
    call = stub.RouteStream(timeout=5)
    try:
        await call.write(router_pb2.RouteStreamRequest(call_id=9, route=router_pb2.RouteRequest(req_id="r")))
        reply = await call.read()
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    except asyncio.InvalidStateError:  # NOTE: refused before the write: the call is over, read its status
        return (await call.code()).name
    call.cancel()
    return "OK" if reply.call_id == 9 else "WRONG ANSWER"


async def test_the_route_stream_is_the_gateways_alone_checked_when_it_opens(server, certs):
    address, registry = server
    ca = certs["router/router"]
    for name, expected in [
        ("gateway/gateway", "OK"),
        ("decode/decode-0", "PERMISSION_DENIED"),
        ("prefill/prefill-0", "PERMISSION_DENIED"),
        ("router/router", "PERMISSION_DENIED"),
        ("operator/operator", "PERMISSION_DENIED"),
    ]:
        stub = router_pb2_grpc.RouterStub(_channel(address, certs[name], ca))
        assert await _one_route_message(stub) == expected, name
    for stranger in (None, certs["rogue"]):  # no certificate, or one from another CA: no TLS session at all
        assert await _one_route_message(router_pb2_grpc.RouterStub(_channel(address, stranger, ca))) == "UNAVAILABLE"
    denied = registry.get_sample_value(
        "tandem_grpc_denied_total", {"service": "tandem.v1.Router", "method": "RouteStream", "role": "decode"}
    )
    assert denied == 1.0


async def test_the_kv_pull_stream_is_the_decode_workers_alone(server, certs):
    address, registry = server
    ca = certs["router/router"]
    for name, expected in [
        ("decode/decode-0", "OK"),
        ("gateway/gateway", "PERMISSION_DENIED"),
        ("prefill/prefill-0", "PERMISSION_DENIED"),
        ("operator/operator", "PERMISSION_DENIED"),
    ]:
        call = worker_pb2_grpc.PrefillWorkerStub(_channel(address, certs[name], ca)).PullKvStream(timeout=5)
        try:
            await call.write(worker_pb2.PullKvStreamRequest(call_id=4, pull=worker_pb2.PullKvRequest(req_id="r")))
            code = "OK" if (await call.read()).call_id == 4 else "WRONG ANSWER"
            call.cancel()
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
        except asyncio.InvalidStateError:  # NOTE: refused before the write: the call is over, read its status
            code = (await call.code()).name
        assert code == expected, name
    denied = registry.get_sample_value(
        "tandem_grpc_denied_total", {"service": "tandem.v1.PrefillWorker", "method": "PullKvStream", "role": "gateway"}
    )
    assert denied == 1.0


async def _drain(call) -> None:
    async for _ in call:
        pass


async def test_no_certificate_or_a_foreign_ca_never_gets_in(server, certs):
    address, _ = server
    ca = certs["router/router"]
    for files in (None, certs["rogue"]):
        stub = router_pb2_grpc.RouterStub(_channel(address, files, ca))
        assert await _code(stub.ListWorkers(router_pb2.ListWorkersRequest(), timeout=5)) == "UNAVAILABLE"


def test_plaintext_binds_loopback_only_unless_told(certs):
    tls.GrpcTls().check_bind("127.0.0.1:5000")
    tls.GrpcTls().check_bind("localhost:5000")
    tls.GrpcTls().check_bind("[::1]:5000")
    for address in ("0.0.0.0:5000", "[::]:5000", "10.0.0.3:5000", "router:5000"):
        with pytest.raises(tls.SettingsError, match="TANDEM_GRPC_INSECURE=1"):
            tls.GrpcTls().check_bind(address)
    tls.GrpcTls(insecure=True).check_bind("0.0.0.0:5000")
    files = certs["router/router"]
    mutual = tls.GrpcTls(cert=str(files.cert), key=str(files.key), ca=str(files.ca), client_auth=True)
    mutual.check_bind("0.0.0.0:5000")
    server_only = tls.GrpcTls(cert=str(files.cert), key=str(files.key), ca=str(files.ca), client_auth=False)
    with pytest.raises(tls.SettingsError):
        server_only.check_bind("0.0.0.0:5000")  # TLS without client certificates authorizes nobody


def test_client_auth_defaults_on_with_a_certificate(monkeypatch, certs):
    for name, value in certs["router/router"].env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TANDEM_GRPC_TLS_CLIENT_AUTH")
    assert tls.from_env().is_mutual and not tls.from_env().reflection
    monkeypatch.setenv("TANDEM_GRPC_TLS_CLIENT_AUTH", "0")
    assert not tls.from_env().is_mutual


@pytest.mark.parametrize("enabled", [False, True])
async def test_reflection_only_when_asked_for(monkeypatch, enabled):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    for name in ("TANDEM_GRPC_TLS_CA", "TANDEM_GRPC_TLS_CERT", "TANDEM_GRPC_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TANDEM_GRPC_REFLECTION", "1" if enabled else "0")
    tls.process_tls.cache_clear()
    server = GrpcServer("127.0.0.1:0", ["tandem.v1.Router"])
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            call = stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
            )
            try:
                names = [s.name async for reply in call for s in reply.list_services_response.service]
                code = "OK"
            except grpc.aio.AioRpcError as exc:
                names, code = [], exc.code().name
    finally:
        await server.stop(0)
        tls.process_tls.cache_clear()
    assert (code, "tandem.v1.Router" in names) == (("OK", True) if enabled else ("UNIMPLEMENTED", False))


def test_a_plaintext_router_on_every_interface_stops_at_start_with_one_line(monkeypatch, capsys):
    from services.router.server import main

    for name in ("TANDEM_GRPC_TLS_CA", "TANDEM_GRPC_TLS_CERT", "TANDEM_GRPC_TLS_KEY", "TANDEM_GRPC_INSECURE"):
        monkeypatch.delenv(name, raising=False)
    tls.process_tls.cache_clear()
    try:
        assert main(["--host", "0.0.0.0", "--port", "0"]) == 2
    finally:
        tls.process_tls.cache_clear()
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "refusing to serve gRPC on 0.0.0.0:0 without mutual TLS" in err
    assert "TANDEM_GRPC_INSECURE=1" in err


async def test_handlers_added_as_generic_handlers_alone_are_guarded_too(monkeypatch, certs):
    # NOTE: the generated add_*_to_server functions register both ways and grpc prefers the registered one;
    # a handler registered only the generic way (reflection, a hand-written service) must not slip past
    for name, value in certs["router/router"].env().items():
        monkeypatch.setenv(name, value)
    tls.process_tls.cache_clear()
    server = GrpcServer("127.0.0.1:0", [])

    async def get_plan(request: bytes, context) -> bytes:
        return b"plan"

    async def echo(request: bytes, context) -> bytes:
        return request

    server.server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "tandem.v1.Planner", {"GetPlan": grpc.unary_unary_rpc_method_handler(get_plan)}
            ),
            grpc.method_handlers_generic_handler("bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}),
        )
    )
    await server.start()
    try:
        ca = certs["router/router"]
        address = f"127.0.0.1:{server.port}"
        results = {}
        for name in ("operator/operator", "gateway/gateway"):
            channel = _channel(address, certs[name], ca)
            for method in ("/tandem.v1.Planner/GetPlan", "/bench.Echo/Echo"):
                results[name, method] = await _code(channel.unary_unary(method)(b"x", timeout=5))
                results[name, method] = await _code(channel.unary_unary(method)(b"x", timeout=5))  # the kept handler
        assert results == {
            ("operator/operator", "/tandem.v1.Planner/GetPlan"): "OK",
            ("operator/operator", "/bench.Echo/Echo"): "PERMISSION_DENIED",  # in no table: refused to everyone
            ("gateway/gateway", "/tandem.v1.Planner/GetPlan"): "PERMISSION_DENIED",
            ("gateway/gateway", "/bench.Echo/Echo"): "PERMISSION_DENIED",
        }
    finally:
        await server.stop(0)
        tls.process_tls.cache_clear()
