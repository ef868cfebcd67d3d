"""The smoke test's handler; it imports the application's own `migrations` package."""

import migrations


def handle(job):
    assert migrations.APP_OWN
    return {"n": job.payload["n"]}
