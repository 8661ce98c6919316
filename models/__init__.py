"""The model side of poolwire, installed as `poolwire.models`: reading model folders, supported
tasks, heads, tokenizing, precision, and the forward backends behind one small interface
(`backend.Backend`). Nothing here knows NATS or the actors."""
