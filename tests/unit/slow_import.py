"""A module that takes a second to import: a stand-in for torch in the fork server's preload
(tests/unit/test_warm.py)."""

import time

time.sleep(1.0)
