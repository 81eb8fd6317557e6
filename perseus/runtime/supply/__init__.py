"""Getting a plan: the cache key, the plan's sources (files, cache, profiling), and the
background planner between phases."""
