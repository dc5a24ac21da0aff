"""The ``slurm`` backend: instances that are nodes of Slurm allocations on a cluster reached over SSH through
its login node.

An instance is one node of one allocation (one ``sbatch``, N nodes for a gang) running corral's agent as the
cluster user; the allocation ends with its job (``idle_duration`` 0 by default). ``batch`` writes the batch
script (pure); ``compute`` is the ``Compute`` (create, gang, stop, reap, interruptions).

The cluster side: ``model`` (a cluster's configuration as the backend reads it from the stored document),
``parse`` (pure: the outputs of ``sinfo``, ``squeue``, ``scontrol show -o node``, ``sbatch --parsable`` and
Slurm's host lists), ``cluster`` (one multiplexed SSH connection per cluster, its commands, the polled snapshot
every caller shares, call counters, the checks made when a backend is configured), ``offers`` (pure: one offer per
schedulable node) and ``registry`` (the clusters of every project, their offers kept fresh).

May import: what ``corral.backends`` may (the domain, the scheduler's offers, the agent's zipapp to ship it, the SSH
connection of ``backends.ssh_conn``).
"""
