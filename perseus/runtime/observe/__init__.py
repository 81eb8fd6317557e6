"""What the runtime tells people: the per-step record, its sinks (metrics file, Prometheus),
the log line and the run summary."""
