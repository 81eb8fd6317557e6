"""Measuring instruments: the energy counter's poller and attribution, blocking power, instruction timers, and the clock a card sustains under load."""
