"""A raw NATS protocol connection on a socket, for the traffic nats-py cannot send: invalid
UTF-8 in subjects and headers (NATS.md section 9)."""

import asyncio
import json


class RawNats:
    def __init__(self, reader, writer) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, url: str, **connect_fields) -> "RawNats":
        host, port = url.removeprefix("nats://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        info = await asyncio.wait_for(reader.readline(), 5)
        assert info.startswith(b"INFO "), info
        fields = {"verbose": False, "pedantic": False, "headers": True, "protocol": 1,
                  **connect_fields}
        writer.write(b"CONNECT " + json.dumps(fields).encode() + b"\r\n")
        conn = cls(reader, writer)
        await conn.ping()
        return conn

    async def ping(self) -> None:
        """PING/PONG: the server has processed everything sent before."""
        self.writer.write(b"PING\r\n")
        await self.writer.drain()
        while True:
            line = await asyncio.wait_for(self.reader.readline(), 5)
            if line.startswith(b"PONG"):
                return
            assert not line.startswith(b"-ERR"), line

    async def pub(self, subject: bytes, payload: bytes, reply: bytes = b"") -> None:
        reply_part = b" " + reply if reply else b""
        self.writer.write(b"PUB " + subject + reply_part + b" %d\r\n" % len(payload) + payload + b"\r\n")
        await self.ping()

    async def hpub(self, subject: bytes, headers: bytes, payload: bytes, reply: bytes = b"") -> None:
        reply_part = b" " + reply if reply else b""
        self.writer.write(b"HPUB " + subject + reply_part
                          + b" %d %d\r\n" % (len(headers), len(headers) + len(payload))
                          + headers + payload + b"\r\n")
        await self.ping()

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass
