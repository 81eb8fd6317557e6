"""The path from the trainer to the clocks: ``controller`` (``FrequencyController``, the measure-only
``NullController``, ``make_controller``), ``process`` (the controller process that owns the device),
``handle`` (what every controller handle shares: its owner process, the at-fork hook, start-up),
``claim`` (one Perseus process per GPU changes its clocks),
``latest_writer`` (the never-blocking request path), ``keeper`` (``ClockKeeper``) and ``notice``
(``ClockNotice``); the handle, keeper, notices and writer are shared with clockd."""
