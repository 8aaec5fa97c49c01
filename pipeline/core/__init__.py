"""The plumbing every package uses: nothing that builds, runs or judges a model.

Errors and exit status (errors), atomic file writes (atomic), content hashes and the stage cache
that skips a stage whose inputs, settings and code did not change (fingerprint, stagecache), typed
options and those several commands share (options), lazy imports naming the pip extra (lazy), quiet
logs, consoles and progress bars (logs, console, progress), a function run in a fresh child process
(isolate), test pause points (pausepoints), ``s3://`` repository URLs (objectstore) and result tables
as plain data (tables).

May import: nothing of the pipeline (the root package's ``__version__`` alone).
"""
