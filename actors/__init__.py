"""The actor runtime and the actors of a poolwire worker, model loading, the embedded NATS
launcher, the client and the CLI (DESIGN.md)."""
