"""The elastic gang: its controller, formations, worker actor, rendezvous, in-memory snapshots
and outside size targets."""
