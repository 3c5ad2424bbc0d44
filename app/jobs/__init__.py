"""Long texts as jobs (docs/jobs.md): a durable store (store.py), a runner (runner.py),
/v1/audio/jobs (routes.py), installed by `app.jobs.install.install(app, state)`.

Nothing is imported here: app/settings.py reads `app.jobs.config` without pulling in the
routes."""
