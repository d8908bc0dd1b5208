"""The fuzz profile a test module runs under, and its example counts.

`fuzz-ci` (the default, derandomized) or `long` (by hand: `--hypothesis-profile=long` or
HYPOTHESIS_PROFILE=long, randomized, FUZZ_SCALE times the CI examples, default 20); both are
registered in conftest.py. Read at import, after the hypothesis plugin has loaded the profile.
"""

from __future__ import annotations

import os

from hypothesis import settings

PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or settings.get_current_profile_name()
if PROFILE not in ("fuzz-ci", "long"):
    PROFILE = "fuzz-ci"
SCALE = int(os.environ.get("FUZZ_SCALE", "20")) if PROFILE == "long" else 1


def profile(ci_examples: int):
    """The fuzz profile with `ci_examples` examples in CI (SCALE x that by hand, randomized)."""
    return settings(settings.get_profile(PROFILE), max_examples=ci_examples * SCALE)
