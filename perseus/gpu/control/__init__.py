"""The path from the trainer to the clocks: the clock controller (a process of its own, or measure-only), its never-blocking request path, the clock keeper and its notices."""
