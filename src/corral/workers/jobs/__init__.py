"""The jobs worker: a placed job handed to its instance's agent, followed while it runs, and its end recorded.

- :mod:`.driver` -- the pass (:class:`~corral.workers.jobs.driver.Jobs`, what the runtime runs), which holds the
  parts below;
- :mod:`.submission` -- the agent's submission, built whole by a pure function, and the act step that hands it over
  and records the start; its pieces: :mod:`.nodes` and :mod:`.container` (pure), :mod:`.code`, :mod:`.volumes`,
  :mod:`.secrets`, :mod:`.ports`;
- :mod:`.follower` -- one loop per running job, acting on the pure ``next_step``; with :mod:`.poll` and
  :mod:`.utilization`;
- :mod:`.leases` -- this replica's leases on its jobs (a component, held by the driver);
- :mod:`.outcomes` -- how a job's start, its progress and its end are recorded.

The parts are held, not inherited: each module says what it owns and may import, none reaches into another's
private names, and the imports run one way (driver -> submission -> follower -> outcomes, leases). The package
may import: corral.domain, corral.scheduler, corral.schemas.wire, corral.store, corral.backends, corral.context,
corral.settings, corral.workers.job_metrics, corral.workers.volumes and corral.workers.run_settle (a run settled in
the transaction that changes its job: :mod:`.outcomes`).
"""
