"""Helpers of ``benchmarks/vs_dstack.py``: server processes (``servers``), the HTTP load generator
(``load``), memory sampling (``procs``) and the workloads run against each server (``workloads``)."""
