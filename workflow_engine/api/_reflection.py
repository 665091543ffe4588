"""Server reflection that carries the contract's comments, so `grpcurl describe` explains it.

grpcio-reflection answers from a descriptor pool, whose files keep no comments (protoc leaves
them out of the generated code). `make proto` also writes the contract as a descriptor set
with its comments (``workflow_engine.binpb``, protoc's ``--include_source_info``); this pool
answers with those files wherever it has them and with the default pool's everywhere else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool

from workflow_engine import v1

DESCRIPTOR_SET = Path(v1.__file__).parent / "workflow_engine.binpb"


class _File:
    """A file descriptor as the reflection servicer reads one, its comments included."""

    def __init__(self, descriptor: Any, commented: dict[str, descriptor_pb2.FileDescriptorProto]):
        self._descriptor = descriptor
        self._commented = commented
        self.name: str = descriptor.name

    @property
    def dependencies(self) -> list[_File]:
        return [_File(d, self._commented) for d in self._descriptor.dependencies]

    def CopyToProto(self, proto: descriptor_pb2.FileDescriptorProto) -> None:
        if self.name in self._commented:
            proto.CopyFrom(self._commented[self.name])
        else:
            self._descriptor.CopyToProto(proto)


class CommentedPool:
    """The default descriptor pool, answering files with their comments where it can."""

    def __init__(self, descriptor_set: Path = DESCRIPTOR_SET) -> None:
        self._pool = descriptor_pool.Default()
        files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set.read_bytes()).file
        for file in files:
            _as_served_before(file.message_type)
        self._commented = {f.name: f for f in files}

    def FindFileByName(self, name: str) -> _File:
        return _File(self._pool.FindFileByName(name), self._commented)

    def FindFileContainingSymbol(self, symbol: str) -> _File:
        try:
            found = self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            # The pool finds services, not their methods (`grpcurl describe Svc.Method`):
            # a method is in its service's file.
            parent = symbol.rpartition(".")[0]
            if not parent or parent not in self._services():
                raise
            found = self._pool.FindFileContainingSymbol(parent)
        return _File(found, self._commented)

    def _services(self) -> set[str]:
        return {
            f"{f.package}.{service.name}" for f in self._commented.values() for service in f.service
        }

    def __getattr__(self, name: str) -> Any:  # the other lookups, unchanged
        return getattr(self._pool, name)


def _as_served_before(messages: Any) -> None:
    """Drop the `json_name` protoc writes into a descriptor set: the generated code's files
    have none, and grpcurl then shows JSON with the .proto's own field names (`run_id`, as the
    the docs' examples), where with it it would switch to lowerCamelCase (`runId`)."""
    for message in messages:
        for field in message.field:
            field.ClearField("json_name")
        _as_served_before(message.nested_type)
