"""Chunked request bodies read strictly: a chunk-size or trailer line that ends in a bare LF is refused at once.

twisted's decoder looks for CRLF only, so a chunk-size line ended by a bare
LF never ended: the request waited for ``body_timeout_ms`` (60 s) and got a
408 saying no byte had come, holding its connection and its key's in-flight
slot all along (a security probe), while a bare LF in the head is a 400 at
once (:meth:`svc.web.limits.LimitedChannel.dataReceived`).  A line runs to
its first LF, so an LF with no CR before it there ends it wrongly: the
decoder raises twisted's malformed-chunk error, which the channel answers
with the process's 400 (status 50) and closes.
"""

from __future__ import annotations

from typing import Any

from twisted.web.http import _ChunkedTransferDecoder, _MalformedChunkedDataError


class StrictChunkedDecoder(_ChunkedTransferDecoder):
    """twisted's chunked decoder, with the lines it reads (chunk sizes, trailers) ended by CRLF only."""

    @classmethod
    def replacing(cls, decoder: Any) -> Any:
        """``decoder`` as a strict one, when it is twisted's chunked decoder (before any byte of the body); any
        other decoder as it is."""
        if type(decoder) is not _ChunkedTransferDecoder:
            return decoder
        return cls(decoder.dataCallback, decoder.finishCallback)

    def _check_line(self) -> None:
        end = self._buffer.find(b"\n")
        if end != -1 and (end == 0 or self._buffer[end - 1] != ord("\r")):
            raise _MalformedChunkedDataError("a chunk line ends in a bare LF; HTTP/1.1 lines end in CRLF")

    def _dataReceived_CHUNK_LENGTH(self) -> bool:  # noqa: N802 (twisted's name)
        self._check_line()
        return bool(super()._dataReceived_CHUNK_LENGTH())

    def _dataReceived_TRAILER(self) -> bool:  # noqa: N802 (twisted's name)
        self._check_line()
        return bool(super()._dataReceived_TRAILER())
