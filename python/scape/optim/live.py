"""The SCAPE optimizers whose lagged mask all-gather may still be in flight, each waited for at
interpreter exit, so that no process group is torn down under it (a user who never called
finish() saw SIGABRT)."""
from __future__ import annotations

import atexit
import weakref

LIVE: "weakref.WeakSet" = weakref.WeakSet()


@atexit.register
def _finish_live_optimizers() -> None:
    for opt in list(LIVE):
        try:
            opt.finish()
        except Exception:  # the group may be gone already; exiting cleanly is all that is left
            opt._next = None
