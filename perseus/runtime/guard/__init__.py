"""The deployed plan checked while training: probe steps at default clocks, the same-run A/B and
the no-slowdown guard."""
