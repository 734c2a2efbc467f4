"""A module that takes 20 s to import: a fork server still importing when its parent dies
(tests/unit/test_local_stop.py)."""

import time

time.sleep(20.0)
