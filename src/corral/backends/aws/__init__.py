"""The ``aws`` backend: EC2 instances launched with RunInstances, reached over SSH like an SSH fleet's hosts.

Modules: :mod:`catalog` (the priced offers, a gpuhunt v2 CSV), :mod:`launch` (pure: tags, client tokens,
user data, how launch errors are classified), :mod:`ec2` (boto3, imported on first use; every call runs in
a thread), :mod:`session` (EC2 in threads, the projects and what launches share), :mod:`compute` (the
``Compute``, which holds a session), :mod:`orphans` (the pure rule of the reaper), :mod:`gangs` (a multi-node
run's instances launched together, all or nothing), :mod:`gang_cleanup` (what a gang leaves to clean up),
:mod:`placement` (cluster placement groups), :mod:`reservations` (capacity reservations).

May import: corral.domain, corral.scheduler types, corral.backends (the SSH backend), boto3 (lazily).
"""
