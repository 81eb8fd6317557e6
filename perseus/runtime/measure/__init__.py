"""Measuring instructions while training: per-instruction time and energy samples, the clock
sweep, and the profiling run that turns them into a stage's profile."""
