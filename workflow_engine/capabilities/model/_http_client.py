"""The model client's HTTP client: the openai SDK's own, reading at most a bounded body.

A model server is untrusted: its answer's body is read through a capped stream, so one that
sends tens of megabytes is refused as they arrive, instead of being read whole and parsed.
"""

from __future__ import annotations

from typing import Any

#: The largest answer body read from a model server: far beyond any answer of the token
#: limits (a million tokens is about 4 MB); a server's larger body is refused as it arrives.
MAX_ANSWER_BYTES = 8 << 20


def capped_http_client(limit: int) -> Any:
    """The SDK's HTTP client (its defaults, the environment's proxies), reading at most
    `limit` bytes of a response's body: beyond that it raises an `openai.APIError`, which the
    SDK passes on as it is, and `answer` does not retry."""
    import httpx2  # the SDK's HTTP client
    import openai

    class Capped(httpx2.AsyncByteStream):
        def __init__(self, stream: Any, request: Any) -> None:
            self._stream, self._request = stream, request

        async def __aiter__(self) -> Any:
            read = 0
            async for chunk in self._stream:
                read += len(chunk)
                if read > limit:
                    raise openai.APIError(
                        f"the answer's body is larger than {limit} bytes", self._request, body=None
                    )
                yield chunk

        async def aclose(self) -> None:
            await self._stream.aclose()

    async def cap(response: Any) -> None:
        response.stream = Capped(response.stream, response.request)

    return openai.DefaultAsyncHttpxClient(event_hooks={"response": [cap]})
