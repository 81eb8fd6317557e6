"""Carbon- and power-aware training on the frontier: grid signals, the intensity forecast, the
policies that pick a point per window, and the replay of a whole trace (docs/carbon.md).

Pure: no torch, no clocks; the runtime's ``CarbonTarget`` / ``PowerCapTarget`` use it."""
