"""What a process tells those who watch it, in one folder: Prometheus metrics (`metrics`,
served across a prefork worker's processes by `scrape`), OpenTelemetry traces (`tracing`),
lifecycle diagnostics for in-process listeners (`diagnostics`, public as
`agent_jobs.diagnostics`), and `observe`, the one seam the runners report a step's, a
run's and a decision's outcome through to all of them.
"""
