"""Bench only (bench/rpc_counts.py puts this folder first on PYTHONPATH): every grpc.aio server in the process gets
one more interceptor counting calls by method, the messages each server stream sends, and the messages each
bidirectional stream receives (by the oneof `call` they carry), written to $TANDEM_BENCH_RPC_COUNTS/<pid>.json every
half second. It changes no call; never on PYTHONPATH outside the bench."""

import collections
import inspect
import json
import os
import threading
import time

import grpc
import grpc.aio

_OUT = os.environ.get("TANDEM_BENCH_RPC_COUNTS", "")
_counts: collections.Counter = collections.Counter()


class _Counting(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return handler
        _counts[f"calls {details.method}"] += 1
        if handler.stream_stream is not None:
            return _counting_bidi(handler, details.method)
        behavior = handler.unary_stream
        if behavior is None or not inspect.isasyncgenfunction(behavior):
            return handler

        async def stream(request, context, key=f"messages {details.method}"):
            async for item in behavior(request, context):
                _counts[key] += 1
                yield item

        return grpc.unary_stream_rpc_method_handler(
            stream, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


async def _counted(requests, method: str):
    async for message in requests:
        try:
            kind = message.WhichOneof("call")
        except ValueError:  # NOTE: a message without that oneof
            kind = None
        _counts[f"messages in {method} {kind}" if kind else f"messages in {method}"] += 1
        yield message


def _counting_bidi(handler, method: str):
    behavior = handler.stream_stream
    if inspect.isasyncgenfunction(behavior):

        async def bidi(requests, context):
            async for item in behavior(_counted(requests, method), context):
                yield item

    else:

        async def bidi(requests, context):
            return await behavior(_counted(requests, method), context)

    return grpc.stream_stream_rpc_method_handler(
        bidi, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


def _write_forever() -> None:
    path = os.path.join(_OUT, f"{os.getpid()}.json")
    while True:
        time.sleep(0.5)
        with open(path + ".tmp", "w") as f:
            json.dump(dict(_counts), f)
        os.replace(path + ".tmp", path)


def _install() -> None:
    original = grpc.aio.server
    started = []

    def server(*args, interceptors=None, **kwargs):
        if not started:
            started.append(threading.Thread(target=_write_forever, daemon=True))
            started[0].start()
        return original(*args, interceptors=[*(interceptors or []), _Counting()], **kwargs)

    grpc.aio.server = server


if _OUT:
    _install()
