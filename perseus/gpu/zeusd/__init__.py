"""The zeusd backend: Zeus's zeusd daemon as the clock and energy service, over its HTTP routes on a Unix socket."""
