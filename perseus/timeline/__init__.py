"""Timelines of a planned iteration: the simulator (plan + profile → times and energy), where clock
switches land (``switch_timing``), plans on GPUs whose switches land late (``switch_lag``) and many
data-parallel pipelines with a straggler (``emulator``). Pure computation."""
