"""Suite-wide settings: live model calls are off; only loopback is ever contacted."""

from __future__ import annotations

import os

import hypothesis

from tests.proof_profiles import hypothesis_profile

# Property tests run a modest, fixed number of examples so the suite stays fast and stable.
hypothesis.settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True)
hypothesis.settings.register_profile("dev", max_examples=100, deadline=None)
hypothesis.settings.load_profile(hypothesis_profile("ci" if os.environ.get("CI") else "dev"))
