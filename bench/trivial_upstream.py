"""A trivial upstream for the gateway benchmark: asyncio, keep-alive, one fixed JSON reply.

Much cheaper per request than any Twisted server, so that the gateway, not
the upstream, is what saturates.  Prints its port as one JSON line.

    python -m bench.trivial_upstream [--port 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json

BODY = b'{"status":0,"status_str":"SUCCESS","task_id":"t","model":{"name":"TRIVIAL","version":"0"},"results":[],' \
       b'"server_time_ms":0.0,"partial":false}'
REPLY = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: "
         + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)


class Upstream(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            marker = head.find(b"content-length:")
            if marker >= 0:
                length = int(head[marker + 15:].split(b"\r\n", 1)[0])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            self.transport.write(self.reply_for(head))

    def reply_for(self, head: bytes) -> bytes:
        """The whole reply to a request whose lower-cased head is ``head``: the same one to every request."""
        return REPLY


async def serve(port: int, protocol: type[Upstream] = Upstream) -> None:
    server = await asyncio.get_running_loop().create_server(protocol, "127.0.0.1", port)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    await server.serve_forever()


def main(protocol: type[Upstream] = Upstream, description: str = __doc__) -> None:
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(serve(parser.parse_args().port, protocol))


if __name__ == "__main__":
    main()
