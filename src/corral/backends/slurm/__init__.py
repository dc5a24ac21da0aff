"""The ``slurm`` backend: instances that are nodes of Slurm allocations on a cluster reached over SSH through
its login node.

An instance is one node of one allocation (one ``sbatch``, N nodes for a gang) running corral's agent as the
cluster user; the allocation ends with its job (``idle_duration`` 0 by default). ``batch`` writes the batch
script (pure); ``compute`` is the ``Compute`` (create, gang, stop, reap, interruptions).

May import: what ``corral.backends`` may (the domain, the scheduler's offers, the agent's zipapp to ship it).
"""
