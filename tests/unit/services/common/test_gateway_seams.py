"""The gateway's gRPC seams become domain types at the boundary (services/common/convert.py), field by field."""

from engines.base.types import FinishReason, SamplingParams, TokenLogprob
from services.common import convert
from services.common.domain import FailureReport, ListedWorker, Prefilled, Route, RouteRequest, TokenDelta, WorkerRef
from services.common.protos import common_pb2, router_pb2, worker_pb2
from services.common.roles import WorkerRole


def test_a_route_with_and_without_a_prefill_worker():
    decode = router_pb2.WorkerRef(worker_id="d", address="d:1")
    assert convert.route_from_pb(router_pb2.RouteResponse(decode=decode)) == Route(WorkerRef("d", "d:1"))
    both = router_pb2.RouteResponse(decode=decode, prefill=router_pb2.WorkerRef(worker_id="p", address="p:2"))
    assert convert.route_from_pb(both) == Route(WorkerRef("d", "d:1"), WorkerRef("p", "p:2"))


def test_a_prefill_answer_keeps_its_handle_as_it_came():
    kv = common_pb2.KvHandle(worker_id="p", req_id="r", num_tokens=3, signature=b"sig")
    lp = common_pb2.TokenLogprob(token_id=7, logprob=-0.5, top=[common_pb2.TopLogprob(token_id=7, logprob=-0.5)])
    msg = worker_pb2.PrefillResponse(first_token_id=7, first_logprob=lp, kv=kv, num_cached_tokens=2)
    first = convert.prefilled_from_pb(msg)
    assert first == Prefilled(7, TokenLogprob(7, -0.5, ((7, -0.5),)), None, 2, kv)
    request = convert.generate_request_to_pb("r", [1, 2], SamplingParams(max_tokens=4), first.kv, [7])
    assert request.kv == kv and list(request.output_token_ids) == [7] and request.params.max_tokens == 4
    done = convert.prefilled_from_pb(
        worker_pb2.PrefillResponse(first_token_id=2, finish_reason=common_pb2.FINISH_REASON_STOP)
    )
    assert done == Prefilled(2, None, FinishReason.STOP, 0, None)
    assert not convert.generate_request_to_pb("r", [1], SamplingParams(), done.kv).HasField("kv")


def test_a_generate_response_is_a_token_delta():
    msg = worker_pb2.GenerateResponse(
        token_ids=[5, 6], finish_reason=common_pb2.FINISH_REASON_LENGTH, num_cached_tokens=4
    )
    assert convert.delta_from_pb(msg) == TokenDelta((5, 6), (), FinishReason.LENGTH, 4)


def test_listed_workers_read_role_model_length_block_size_and_lease():
    info = router_pb2.WorkerInfo(
        worker_id="d",
        role=common_pb2.WORKER_ROLE_DECODE,
        model="m",
        max_model_len=99,
        layout=common_pb2.KvLayout(block_size=16),
    )
    listing = router_pb2.ListWorkersResponse(
        workers=[
            router_pb2.WorkerStatus(worker=info, lease_expires_in_s=3),
            router_pb2.WorkerStatus(worker=router_pb2.WorkerInfo()),
        ]
    )
    assert convert.listed_workers_from_pb(listing) == [
        ListedWorker(WorkerRole.DECODE, "m", 99, 16, True),
        ListedWorker(None, "", 0, 0, False),
    ]


def test_a_route_request_with_and_without_block_hashes():
    msg = convert.route_request_to_pb(RouteRequest("r", "m", [1, 2, 3], ["d1"], [11, 12], 2, "salt"))
    assert (msg.req_id, msg.model, list(msg.token_ids), list(msg.exclude_worker_ids)) == ("r", "m", [1, 2, 3], ["d1"])
    assert (list(msg.block_hashes), msg.hash_block_size, msg.cache_salt) == ([11, 12], 2, "salt")
    # NOTE: a block size with no hashes says nothing to the router: it hashes the prompt itself
    bare = convert.route_request_to_pb(RouteRequest("r", "m", [1], block_size=16))
    assert (list(bare.block_hashes), bare.hash_block_size, bare.cache_salt) == ([], 0, "")


def test_the_cleanup_calls_carry_their_request_and_worker():
    report = convert.failure_report_to_pb(FailureReport("d1", "r", "UNAVAILABLE"))
    assert report == router_pb2.ReportFailureRequest(worker_id="d1", req_id="r", reason="UNAVAILABLE")
    assert convert.complete_request_to_pb("r") == router_pb2.CompleteRequest(req_id="r")
    assert convert.abort_request_to_pb("r") == worker_pb2.AbortRequest(req_id="r")
    assert convert.release_kv_request_to_pb("r") == worker_pb2.ReleaseKvRequest(req_id="r")
    assert convert.list_workers_request_to_pb() == router_pb2.ListWorkersRequest()
