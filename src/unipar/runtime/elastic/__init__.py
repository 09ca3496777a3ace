"""The gang of training workers: its one controller and recovery policies (live, or a
restart from the newest disk checkpoint), formations, worker actor, rendezvous, in-memory
snapshots and outside size targets."""
