"""Files that must survive a crash: the profile/frontier cache keyed by the job (``cache``); its
writes go through the one atomic write, ``perseus.atomic``."""
