"""Imported first by the warm workers' fork server (:class:`asyncinfer.local.warm.WarmStarter`
puts it at the head of the preload list): importing it makes the importing process hold a
lifeline to its parent (:func:`asyncinfer.local.lifeline.hold`, SIGKILL at once).

The fork server already exits once the process that started it is gone, but only when it next
looks, after its imports, and then tears down an interpreter holding torch (seconds, on a busy
machine); with this it goes within a quarter of a second, even while it is still importing.
Workers forked from it are not affected (a fork inherits no thread) and hold lifelines of their
own. Nothing else imports this module; in any other process it would do the same.
"""

from __future__ import annotations

import os
import signal

from asyncinfer.local import lifeline

#: Whether the import took hold (the parent was not already gone: then ``init`` adopted us and
#: the fork server's own end-of-parent check ends it after its imports).
HELD = os.getppid() != 1 and lifeline.hold(os.getppid(), sig=signal.SIGKILL, grace=0.0)
