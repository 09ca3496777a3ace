"""Sharing a cluster among jobs: job and cluster models, scheduling policies and a
trace-driven simulator. Pure: no Ray, no processes (`unipar simulate` drives it)."""
