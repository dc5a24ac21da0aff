"""The SSH endpoint of jobs: an asyncssh server in the corral server process, started on first use.

It owns the listener (:mod:`corral.sshd.endpoint`: dstack's ``dockerized`` layout, the ``<run>-host``
hop, whose user name names the job, and the ``<run>`` hop inside it), the sessions it relays to the
job's agent (:mod:`corral.sshd.sessions`: exec, shell with a pty, sftp and scp through the host's
sftp-server, forwarded connections) and the job's ``/logs_ws`` websocket (:mod:`corral.sshd.logs_ws`).

It is an edge, like ``api/``: it may import ``services`` (who may log in, which job, its output), ``backends``
(the channel to the agent), the agent's session protocol (``agent.protocol_session``), ``context`` (the
application context), ``settings`` and asyncssh -- never ``store`` directly. Nothing here is imported on the
server's start path.
"""
