"""Files that must survive a crash: the one atomic write (``atomic``) and the profile/frontier
cache keyed by the job (``cache``)."""
