"""Zeus's zeusd as the clock and energy service: ``client`` (``ZeusdClient``, its HTTP routes on a
Unix socket, refusals as typed errors) and ``device`` (``ZeusdGPU``: a base device whose clocks,
power limit and energy go through zeusd, driven by the controller process)."""
