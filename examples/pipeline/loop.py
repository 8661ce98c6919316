"""The whole pipeline loop on one machine (docs/DURABLE.md, "Pipelines"):

    python examples/pipeline/loop.py setup                # streams DOCS and RESULTS
    poolwire serve --nats-url nats://127.0.0.1:4222 --pipeline-stream DOCS \\
        --pipeline-input docs.in --pipeline-output docs.embedded --pipeline-id-field id
    python examples/pipeline/loop.py publish --count 100  # documents onto docs.in.<id>
    python examples/pipeline/loop.py nearest              # answers docs.nearest from RESULTS
    python examples/pipeline/loop.py query "a sentence about rivers"

Documents are JSON maps `{"id", "text"}` in the stream DOCS, which poolwire does not own. The
worker embeds each one and publishes the result to `docs.embedded.<id>`, which the stream
RESULTS keeps (de-duplicating redeliveries by Nats-Msg-Id). `nearest` reads every result from
RESULTS, keeps following it, and answers nearest-neighbour queries on `docs.nearest`, embedding
the query through the same worker (request/reply)."""

import argparse
import asyncio
import json
import os

import msgpack
import nats
import numpy as np
from nats.js.api import ConsumerConfig, DeliverPolicy, StreamConfig

from poolwire.client import PoolingClient

TOPICS = ["rivers and lakes", "mountain climbing", "baking bread", "jazz music", "orbital mechanics",
          "garden vegetables", "medieval castles", "electric cars"]


def documents(count: int) -> list[dict]:
    return [{"id": f"doc-{i}", "text": f"Note {i} is about {TOPICS[i % len(TOPICS)]}."}
            for i in range(count)]


async def setup(nc, args) -> None:
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=args.docs_stream, subjects=["docs.in.>"]))
    # duplicate_window covers redeliveries: a result stored twice is kept once.
    await js.add_stream(StreamConfig(name=args.results_stream, subjects=["docs.embedded.>"],
                                     duplicate_window=600.0))
    print(f"streams {args.docs_stream} (docs.in.>) and {args.results_stream} (docs.embedded.>) ready")


async def publish(nc, args) -> None:
    js = nc.jetstream()
    for doc in documents(args.count):
        await js.publish(f"docs.in.{doc['id']}", json.dumps(doc).encode())
    print(f"published {args.count} documents to docs.in.<id>")


def decode(data: bytes) -> dict:
    return json.loads(data) if data.lstrip()[:1] == b"{" else msgpack.unpackb(data)


class Index:
    """Vectors by document id; results are normalised embeddings, so cosine is a dot product."""

    def __init__(self) -> None:
        self.vectors: dict[str, np.ndarray] = {}

    def add(self, result: dict) -> None:
        if "error" not in result:
            self.vectors[str(result["doc_id"])] = np.asarray(result["data"][0]["data"], np.float32)

    def nearest(self, query: np.ndarray, k: int) -> list[dict]:
        ids = list(self.vectors)
        if not ids:
            return []
        scores = np.stack([self.vectors[i] for i in ids]) @ query
        order = np.argsort(-scores)[:k]
        return [{"doc_id": ids[j], "score": round(float(scores[j]), 4)} for j in order]


async def nearest(nc, args) -> None:
    index = Index()
    js = nc.jetstream()

    async def add(msg) -> None:
        index.add(decode(msg.data))

    await js.subscribe("docs.embedded.>", stream=args.results_stream, ordered_consumer=True,
                       config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL), cb=add)
    client = PoolingClient(nc, prefix=args.prefix)

    async def answer(msg) -> None:
        query = json.loads(msg.data)
        reply = await client.embed(query["text"])
        vector = np.asarray(reply["data"][0]["data"], np.float32)
        await msg.respond(json.dumps({"neighbours": index.nearest(vector, query.get("k", 3)),
                                      "indexed": len(index.vectors)}).encode())

    await nc.subscribe("docs.nearest", cb=answer)
    await nc.flush()
    print("answering nearest-neighbour queries on docs.nearest", flush=True)
    await asyncio.Event().wait()


async def query(nc, args) -> None:
    reply = await nc.request("docs.nearest", json.dumps({"text": args.text, "k": args.k}).encode(),
                             timeout=30)
    print(json.dumps(json.loads(reply.data)))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nats-url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--prefix", default=os.environ.get("POOLWIRE_PREFIX", "pooling"))
    parser.add_argument("--docs-stream", default="DOCS")
    parser.add_argument("--results-stream", default="RESULTS")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup")
    sub.add_parser("publish").add_argument("--count", type=int, default=100)
    sub.add_parser("nearest")
    q = sub.add_parser("query")
    q.add_argument("text")
    q.add_argument("-k", type=int, default=3)
    args = parser.parse_args()
    nc = await nats.connect(args.nats_url)
    try:
        await {"setup": setup, "publish": publish, "nearest": nearest, "query": query}[args.command](nc, args)
    finally:
        await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
