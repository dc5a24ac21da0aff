"""Compute providers behind a small ``Compute`` protocol (offers, create, terminate, list owned),
the server-side client of the host agent, the local port forwarded to an agent that SSH fleets and Slurm share
(``local_forward``), the processes started on this machine that outlive the server (``local_process``: the local
agents, a local fleet's gateway), and the channel to a gateway's host (``gateway_link``: the process deployed over
SSH, a local and a reverse forward; ``gateway_local``: the process started on this machine) with the client of its
management API (``gateway_api``, httpx).

May import: corral.domain, corral.scheduler (offers and their codec, blocks, fallbacks), the agent's wire
protocol (corral.agent.protocol*), corral.settings (the agent client speaks HTTP/1.1 itself: ``agent_http``).

Known exceptions (listed in pyproject.toml's contract): ``local.py`` describes and splits this host and runs
jobs in it with the agent's own modules (sandbox, resources, containers), ``ssh.py`` ships the agent's zipapp,
and ``ssh_secrets.py`` seals SSH keys with ``store.encryption``; ``slurm.compute`` ships the zipapp too.
"""
