"""Parameter servers on Ray (the runtime side of :mod:`unipar.ps`): the server and client
actors, the driver that trains on them, and the glue that runs a :class:`~unipar.job.Job`
there for ``fit``."""
