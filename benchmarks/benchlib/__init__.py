"""Helpers of ``benchmarks/vs_dstack.py``: server processes (``servers``), the HTTP load generator
(``load``), memory sampling (``procs``) and the workloads run against each server (``workloads``); and of the
other benchmarks, among them a server in the benchmark's own process (``in_process``) and the service the proxy
benchmarks measure through, with their keep-alive load client (``ok_service``)."""
