"""A module run under ``python -m asyncinfer.local.lifeline`` (tests/unit/test_local_stop.py):
writes its ``sys.argv`` to ``argv[1]``, then ignores SIGTERM and sleeps."""

import json
import signal
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(sys.argv[1]).write_text(json.dumps(sys.argv))
    time.sleep(60)
