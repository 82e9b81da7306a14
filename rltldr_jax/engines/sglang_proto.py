"""Messages and stubs of SGLang's native gRPC service, built from `proto/sglang/runtime/v1/sglang.proto`.

The `.proto` (our subset of `sglang.runtime.v1.SglangService`, see its header) is compiled by grpcio-tools'
`protoc` on first use into a private descriptor pool; message classes and stubs are made from the
descriptors. Nothing generated is committed or written into the package, and nothing is registered under
the `sglang` module name, so a real `sglang` installation in the same environment cannot clash with it.

    from rltldr_jax.engines import sglang_proto as pb
    stub = pb.Stub(channel)                      # grpc.Channel or grpc.aio.Channel
    request = pb.GenerateRequest(input_ids=[1, 2], sampling_params=pb.SamplingParams(max_new_tokens=8))
    for response in stub.Generate(request): ...  # server streaming, like the generated stubs
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import grpc
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool, message_factory

PROTO_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "proto")
PROTO_FILE = "sglang/runtime/v1/sglang.proto"
SERVICE = "sglang.runtime.v1.SglangService"

#: The environment variable holding the servers' shared API key (SGLang's `--api-key`), read by the client and by
#: launch/serve.py: an environment variable, not a config key, so that it is never saved in a run's config, logged,
#: or visible in `ps`.
API_KEY_ENV = "RLTLDR_ENGINE_API_KEY"


def auth_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    """The gRPC metadata that carries `api_key`: SGLang's HTTP header `Authorization: Bearer KEY`, as gRPC metadata
    (lower-case key). Empty without a key."""
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


@functools.cache
def file_descriptor() -> descriptor.FileDescriptor:
    """Compiles the .proto with grpcio-tools' protoc (once per process) into a private descriptor pool."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sglang.pb")
        code = protoc.main(["protoc", f"-I{PROTO_ROOT}", f"--descriptor_set_out={out}", PROTO_FILE])
        if code != 0:
            raise RuntimeError(f"protoc failed ({code}) on {os.path.join(PROTO_ROOT, PROTO_FILE)}")
        with open(out, "rb") as f:
            files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    return pool.FindFileByName(PROTO_FILE)


def service_descriptor() -> descriptor.ServiceDescriptor:
    return file_descriptor().services_by_name["SglangService"]


@functools.cache
def message_class(name: str) -> type:
    """The message class for a message of the .proto, e.g. `message_class("GenerateRequest")`."""
    try:
        desc = file_descriptor().message_types_by_name[name]
    except KeyError:
        raise AttributeError(f"{PROTO_FILE} has no message {name!r}") from None
    return message_factory.GetMessageClass(desc)


def __getattr__(name: str) -> type:  # module attributes: pb.GenerateRequest, pb.SamplingParams, ...
    if name[:1].isupper():
        return message_class(name)
    raise AttributeError(name)


def _method_path(name: str) -> str:
    return f"/{SERVICE}/{name}"


class Stub:
    """Client stub with one callable per RPC, for a `grpc.Channel` or a `grpc.aio.Channel`.

    `api_key`: sent with every call (`auth_metadata`), for servers started with an API key.
    """

    def __init__(self, channel: grpc.Channel | grpc.aio.Channel, api_key: str | None = None):
        metadata = auth_metadata(api_key)
        for method in service_descriptor().methods:
            request, response = message_class(method.input_type.name), message_class(method.output_type.name)
            make = channel.unary_stream if method.server_streaming else channel.unary_unary
            call = make(_method_path(method.name), request.SerializeToString, response.FromString)
            setattr(self, method.name, functools.partial(call, metadata=metadata) if metadata else call)


def generic_handler(implementations: Mapping[str, Callable[..., Any]]) -> grpc.GenericRpcHandler:
    """A handler for `server.add_generic_rpc_handlers` from {method name: implementation}.

    Implementations have the generated servicer's signature, `(request, context)`; for the server-streaming
    `Generate` they are (async) generators. Every RPC of the .proto must be implemented.
    """
    handlers = {}
    for method in service_descriptor().methods:
        if method.name not in implementations:
            raise ValueError(f"no implementation for {SERVICE}/{method.name}")
        request, response = message_class(method.input_type.name), message_class(method.output_type.name)
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(
            implementations[method.name],
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
    unknown = set(implementations) - set(handlers)
    if unknown:
        raise ValueError(f"{sorted(unknown)} are not RPCs of {SERVICE}")
    return grpc.method_handlers_generic_handler(SERVICE, handlers)
