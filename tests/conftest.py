"""Shared pytest configuration: hypothesis profiles (fast locally, thorough in CI)."""

from __future__ import annotations

import os
import signal

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "ci",
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# A shell without job control starts its background commands with SIGINT ignored (`make test &`
# in a script, a CI runner's job), and every process they start inherits that, so Ctrl-C would
# reach no test that sends it. Python's own handler here gives the tests, and the commands they
# start (a handled signal is reset to its default on exec), the disposition of a terminal's job.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
